#!/bin/sh
# Build the test driver packages of molecule/driver_packages: metax-driver in
# each VERSION as a real .deb (dpkg-deb --build) and a real .rpm (rpmbuild),
# into OUT. Runs inside a throwaway container of the rpm node image, which has
# both tools (prepare.yml starts it; nothing is committed as a binary).
#
# A package carries what a driver package carries, in miniature:
#   /lib/modules/metax-sim/metax.ko        the "kernel module" (a payload file)
#   /usr/share/metax-driver/version        its version
#   /usr/bin/mx-smi                        answers rc 0 with the version
# Usage: build-driver-packages.sh OUT VERSION...
set -eu
out=$1
shift
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

payload() {   # payload ROOT VERSION
  mkdir -p "$1/lib/modules/metax-sim" "$1/usr/share/metax-driver" "$1/usr/bin"
  printf 'MetaX kernel module stand-in %s\n' "$2" >"$1/lib/modules/metax-sim/metax.ko"
  printf '%s\n' "$2" >"$1/usr/share/metax-driver/version"
  printf '#!/bin/sh\necho "mx-smi version: %s"\nexit 0\n' "$2" >"$1/usr/bin/mx-smi"
  chmod 0755 "$1/usr/bin/mx-smi"
}

for version in "$@"; do
  deb=$work/deb-$version
  payload "$deb" "$version"
  mkdir -p "$deb/DEBIAN"
  cat >"$deb/DEBIAN/control" <<CONTROL
Package: metax-driver
Version: $version-1
Architecture: all
Maintainer: metax.gpu tests <metax-gpu@example.invalid>
Description: MetaX driver stand-in for the metax.gpu Molecule scenario
CONTROL
  dpkg-deb --root-owner-group -Zgzip --build "$deb" "$out/metax-driver_${version}_all.deb" >/dev/null

  top=$work/rpm-$version
  mkdir -p "$top/SPECS" "$top/SOURCES"
  payload "$top/SOURCES/root" "$version"
  cat >"$top/SPECS/metax-driver.spec" <<SPEC
Name: metax-driver
Version: $version
Release: 1
Summary: MetaX driver stand-in for the metax.gpu Molecule scenario
License: Apache-2.0
BuildArch: noarch
AutoReqProv: no

%description
MetaX driver stand-in for the metax.gpu Molecule scenario.

%install
cp -a %{_topdir}/SOURCES/root/. %{buildroot}/

%files
/lib/modules/metax-sim/metax.ko
/usr/share/metax-driver/version
/usr/bin/mx-smi
SPEC
  rpmbuild --quiet --define "_topdir $top" --define "_build_id_links none" \
    -bb "$top/SPECS/metax-driver.spec" >/dev/null
  cp "$top/RPMS/noarch/metax-driver-$version-1.noarch.rpm" "$out/"
done
ls "$out"
