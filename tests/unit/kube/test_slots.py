"""The slot budget on Leases (plugins/module_utils/kube/slots.py): the pure choice, and the API calls
it makes against an in-memory API server with the real one's conflict rules (tests/fake_leases.py).
test_driver_manager_cluster.py takes the slots on the local cluster's API server."""
from __future__ import annotations

import datetime
import threading
import time

import pytest
from fake_leases import FakeLeaseApi

from ansible_collections.metax.gpu.plugins.module_utils.kube import slots as sl

NS, PREFIX = "metax-operator", "metax-vfnum-slot"
NOW = 1_800_000_000.0


def lease(name, holder, renewed=NOW, duration=30, version="1"):
    return sl.LeaseState(name, holder, renewed, duration, version)


@pytest.mark.parametrize("leases, size, action, name", [
    ([], 1, "create", PREFIX + "-0"),
    ([lease(PREFIX + "-0", "vm")], 1, "none", None),
    ([lease(PREFIX + "-0", "vm")], 2, "create", PREFIX + "-1"),
    ([lease(PREFIX + "-0", "me")], 1, "own", PREFIX + "-0"),                       # a restarted holder
    ([lease(PREFIX + "-0", "vm", renewed=NOW - 31)], 1, "take_over", PREFIX + "-0"),  # its holder died
    ([lease(PREFIX + "-1", "vm")], 1, "none", None),       # a pool shrunk to 1 while slot 1 was held
    ([lease("other-0", "vm")], 1, "create", PREFIX + "-0"),                        # another pool's
])
def test_choose(leases, size, action, name):
    choice = sl.choose(leases, PREFIX, size, "me", NOW)
    assert (choice.action, choice.name) == (action, name)


def test_choose_names_the_holders_when_the_pool_is_full():
    choice = sl.choose([lease(PREFIX + "-0", "vm"), lease(PREFIX + "-1", "vm-2")], PREFIX, 2, "me", NOW)
    assert choice.action == "none" and list(choice.holders) == ["vm", "vm-2"]
    with pytest.raises(sl.SlotError):
        sl.choose([], PREFIX, 0, "me", NOW)


def pool(api, holder, size=2, clock=lambda: NOW):
    return sl.Slots(api, NS, PREFIX, size, holder, clock=clock)


def test_at_most_size_holders_and_a_released_slot_is_taken_by_the_next():
    api = FakeLeaseApi()
    a, b, c = pool(api, "vm"), pool(api, "vm-2"), pool(api, "vm-3")
    assert a.take() == PREFIX + "-0" and b.take() == PREFIX + "-1"
    assert c.take() is None and list(c.holders) == ["vm", "vm-2"]
    body = api.leases[(NS, PREFIX + "-0")]
    assert body["spec"]["holderIdentity"] == "vm" and body["metadata"]["labels"] == {sl.POOL_LABEL: PREFIX}
    a.release()
    assert c.take() == PREFIX + "-0"
    b.release()
    c.release()
    assert api.leases == {}
    # one list per take, one create per slot taken, one delete per release: nothing polled
    assert {verb for verb, _name in api.calls} == {"list", "create", "delete"}
    assert api.calls.count(("list", "%s=%s" % (sl.POOL_LABEL, PREFIX))) == 4
    assert sorted(n for v, n in api.calls if v == "delete") == [PREFIX + "-0", PREFIX + "-0", PREFIX + "-1"]


def test_a_slot_whose_holder_stopped_renewing_is_taken_over_and_the_old_holder_cannot_delete_it():
    api = FakeLeaseApi()
    now = [NOW]
    dead = pool(api, "vm", size=1, clock=lambda: now[0])
    assert dead.take() == PREFIX + "-0"
    dead._stop.set()                      # its renewals stop (the process hangs)
    heir = pool(api, "vm-2", size=1, clock=lambda: now[0])
    assert heir.take() is None            # still within the lease's 30 s
    now[0] += 31
    assert heir.take() == PREFIX + "-0"
    assert ("replace", PREFIX + "-0") in api.calls
    assert api.leases[(NS, PREFIX + "-0")]["spec"]["holderIdentity"] == "vm-2"
    assert not dead.renew() and dead.held is None     # the old holder learns it lost the slot
    dead.release()
    assert api.leases[(NS, PREFIX + "-0")]["spec"]["holderIdentity"] == "vm-2"
    heir.release()
    assert api.leases == {}


def test_two_takers_that_read_the_same_free_slot_get_it_once():
    api = FakeLeaseApi()
    slow = pool(api, "vm-2", size=1)
    stale = slow.leases()                 # read before the other taker's create
    assert pool(api, "vm", size=1).take() == PREFIX + "-0"
    slow.leases = lambda: stale           # so its create of the same name meets the server's 409
    assert slow.take() is None and slow.held is None
    assert api.calls[-1] == ("create", PREFIX + "-0")


def test_renew_moves_renew_time_and_a_restarted_holder_keeps_its_slot():
    api = FakeLeaseApi()
    now = [NOW]
    first = pool(api, "vm", size=1, clock=lambda: now[0])
    first.take()
    now[0] += 10
    assert first.renew()
    renewed = sl.lease_state(api.leases[(NS, PREFIX + "-0")])
    assert renewed.renewed == pytest.approx(NOW + 10) and renewed.holder == "vm"
    again = pool(api, "vm", size=1, clock=lambda: now[0])   # the same node after a restart
    assert again.take() == PREFIX + "-0" and again.version == api.leases[(NS, PREFIX + "-0")]["metadata"]["resourceVersion"]
    again.release()
    first._stop.set()
    assert api.leases == {}


def test_lease_times_as_the_api_server_writes_them():
    stamp = datetime.datetime(2026, 11, 27, 10, 0, 0, 250000, tzinfo=datetime.timezone.utc)
    item = {"metadata": {"name": "x", "resourceVersion": "7"},
            "spec": {"holderIdentity": "vm", "renewTime": "2026-11-27T10:00:00.250000Z", "acquireTime": None,
                     "leaseDurationSeconds": 15}}
    assert sl.lease_state(item) == sl.LeaseState("x", "vm", stamp.timestamp(), 15, "7")
    assert sl._epoch(sl.micro_time(stamp.timestamp())) == pytest.approx(stamp.timestamp())


# -- waiting for a slot: the watched view, the turn, the herd ------------------------------------
def test_home_slots_spread_the_holders_and_the_home_slot_is_tried_first():
    homes = [sl.home_slot(PREFIX, 10, "node-%04d" % i) for i in range(1000)]
    per_slot = [homes.count("%s-%d" % (PREFIX, i)) for i in range(10)]
    assert sum(per_slot) == 1000 and min(per_slot) > 60          # about 100 each, none left out
    assert sl.home_slot(PREFIX, 10, "node-0001") == sl.home_slot(PREFIX, 10, "node-0001")
    assert sl.turn_pause([PREFIX + "-3"], PREFIX + "-3", 2.0, lambda: 0.5) == 1.0
    assert sl.turn_pause([PREFIX + "-4"], PREFIX + "-3", 2.0, lambda: 0.5) == 3.0    # after the home waiters


def test_the_watched_view_says_which_slots_are_free_and_take_needs_no_list():
    api = FakeLeaseApi()
    now = [NOW]
    holder, waiter = pool(api, "vm", clock=lambda: now[0]), pool(api, "me", clock=lambda: now[0])
    assert waiter.free() == []                    # no view yet: nothing known, take() would list
    holder.take()
    api.watch(waiter)
    assert waiter.free() == [PREFIX + "-1"]
    other = pool(api, "vm-2", clock=lambda: now[0])
    other.take()
    assert waiter.free() == []                    # its ADDED filled the view
    holder._stop.set()
    other._stop.set()
    now[0] += 31                                   # both stopped renewing: expired by the clock
    assert waiter.free() == [PREFIX + "-0", PREFIX + "-1"]
    calls = len(api.calls)
    assert waiter.take() == PREFIX + "-0"
    assert api.calls[calls:] == [("replace", PREFIX + "-0")]     # taken over from the view, no list
    waiter._stop.set()
    waiter.unwatched()
    assert waiter.view is None and waiter.free() == []


def test_without_a_view_the_wait_ends_at_the_timeout_for_a_blind_retry():
    waiter = pool(FakeLeaseApi(), "me")
    assert waiter.wait_turn(threading.Event(), 0.0) is True
    api = FakeLeaseApi()
    pool(api, "vm", size=1).take()
    watched = pool(api, "me", size=1)
    api.watch(watched)
    assert watched.wait_turn(threading.Event(), 0.0) is False     # the view shows none free: keep waiting


def test_one_freed_slot_draws_one_create_from_many_waiters():
    api = FakeLeaseApi()
    holders = [pool(api, "vm-%d" % i) for i in range(2)]
    for holder in holders:
        assert holder.take()
    stop = threading.Event()
    won = []
    waiters = []
    for i in range(8):
        waiter = pool(api, "w-%d" % i)
        waiter.spread = 0.2
        waiter.rnd = lambda i=i: i / 8.0           # distinct pauses: the herd is not left to luck
        api.watch(waiter)
        waiters.append(waiter)

    def wait(waiter):
        while not stop.is_set():
            if waiter.wait_turn(stop, 30.0) and waiter.take():
                won.append(waiter.holder)
                return
    threads = [threading.Thread(target=wait, args=(w,), daemon=True) for w in waiters]
    for thread in threads:
        thread.start()
    before = len(api.calls)
    holders[0].release()
    deadline = time.monotonic() + 60.0
    while not won and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    threading.Event().wait(0.5)                  # past every waiter's pause: the losers rechecked
    stop.set()
    for thread in threads:
        thread.join(60)
    creates = [c for c in api.calls[before:] if c[0] == "create"]
    assert len(won) == 1 and creates == [("create", PREFIX + "-0")], api.calls[before:]
    assert not any(verb == "list" for verb, _n in api.calls[before:])     # the view, not lists
    for slots in waiters + holders:
        slots.release()


def test_a_lost_race_after_the_winners_event_keeps_the_winner_and_never_takes_over_without_a_version():
    api = FakeLeaseApi()
    now = [NOW]
    late = pool(api, "me", size=1, clock=lambda: now[0])
    api.watch(late)
    api.watchers.remove(late)
    winner = pool(api, "vm", size=1, clock=lambda: now[0])
    create = api.create_namespaced_lease

    def winner_first(namespace, body):
        """The winner's create and its ADDED reach the view between this taker's choice and its 409."""
        api.create_namespaced_lease = create
        assert winner.take() == PREFIX + "-0"
        late.seen("ADDED", api.leases[(NS, PREFIX + "-0")])
        return create(namespace, body)
    api.create_namespaced_lease = winner_first
    assert late.take() is None and api.calls[-1] == ("create", PREFIX + "-0")     # the 409
    assert late.view[PREFIX + "-0"].holder == "vm"      # the winner's Lease, not a mark without a version
    now[0] += sl.LOST_HOLD + 1                          # a mark would have expired by now
    assert late.free() == [] and late.take() is None and late.holders == ("vm",)
    late.view[PREFIX + "-0"] = sl.LeaseState(PREFIX + "-0", "?", NOW, sl.LOST_HOLD, "")     # an expired mark
    assert late.take() is None and api.calls[-1] == ("create", PREFIX + "-0")     # tried as missing: 409
    assert not any(verb == "replace" for verb, _n in api.calls)                   # never a blind takeover
    winner._stop.set()


def test_a_lost_race_counts_the_slot_held_in_the_view_until_the_winners_event():
    api = FakeLeaseApi()
    now = [NOW]
    late = pool(api, "me", size=1, clock=lambda: now[0])
    api.watch(late)
    api.watchers.remove(late)              # its watch falls behind: the winner's ADDED not seen yet
    winner = pool(api, "vm", size=1, clock=lambda: now[0])
    assert winner.take() == PREFIX + "-0"
    assert late.free() == [PREFIX + "-0"]  # stale
    assert late.take() is None and api.calls[-1] == ("create", PREFIX + "-0")     # the 409
    assert late.free() == []               # not woken again for it
    late.seen("ADDED", api.leases[(NS, PREFIX + "-0")])
    assert late.view[PREFIX + "-0"].holder == "vm"
    now[0] += sl.LOST_HOLD + 1
    late.seen("DELETED", api.leases[(NS, PREFIX + "-0")])
    assert late.free() == [PREFIX + "-0"]
    winner._stop.set()


def _json_lease(name, holder, renewed, version, duration=30):
    """A Lease as the API server's JSON (what driver-manager's watch hands the view, kube/watch.py)."""
    return {"kind": "Lease", "metadata": {"name": name, "namespace": NS, "resourceVersion": version,
                                          "labels": {sl.POOL_LABEL: PREFIX}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "acquireTime": sl.micro_time(renewed), "renewTime": sl.micro_time(renewed)}}


def test_the_view_reads_a_watchs_json_leases_as_it_reads_the_clients_models():
    held = _json_lease(PREFIX + "-0", "vm", NOW - 1.5, "7")
    assert sl.lease_state(held) == sl.LeaseState(PREFIX + "-0", "vm", NOW - 1.5, 30, "7")
    slots = sl.Slots(FakeLeaseApi(), NS, PREFIX, 2, "me", clock=lambda: NOW)
    slots.relisted([held])
    assert slots.free() == [PREFIX + "-1"]
    slots.seen("ADDED", _json_lease(PREFIX + "-1", "vm-2", NOW, "8"))
    assert slots.free() == []                                       # both held
    slots.seen("DELETED", held)
    assert slots.free() == [PREFIX + "-0"]
    slots.seen("MODIFIED", {"kind": "Lease"})                       # no metadata: nothing to see
    assert slots.free() == [PREFIX + "-0"]
    # a Lease never renewed reads as renewed at 0 (long expired), with the default duration
    assert sl.lease_state({"metadata": {"name": "x"}, "spec": {}}) == sl.LeaseState("x", "", 0.0, sl.DEFAULT_DURATION, "")
