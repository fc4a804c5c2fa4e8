// Copyright: metax.gpu contributors
// Apache License 2.0 (see LICENSE)

// Command go-gpuallocator runs NVIDIA's best-effort allocation policy
// (github.com/NVIDIA/go-gpuallocator) on synthetic topologies read from
// stdin, for the side-by-side comparison in benchmarks/compare_go.py.
//
// Input (JSON): {"cases": [{"name": "...", "devices": N,
//   "links": [[a, b, [linkType, ...]], ...],
//   "requests": [{"id": "...", "available": [...], "required": [...],
//                 "sizes": [n, ...], "budget_ms": 200}]}]}
// linkType is the numeric value of go-gpuallocator's internal P2PLinkType
// (1 cross CPU, 2 same CPU, 3 host bridge, 4 multi switch, 5 single switch,
// 6 same board, 7 one NVLink, 8 two NVLinks, ...). A request with several
// sizes is a sequence: each step allocates from what the previous steps left.
//
// Output (JSON): {"results": [{"case": ..., "id": ..., "steps": [{"size": n,
//   "chosen": [...], "ms": median milliseconds, "runs": k}]}]}
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
)

type request struct {
	ID        string `json:"id"`
	Available []int  `json:"available"`
	Required  []int  `json:"required"`
	Sizes     []int  `json:"sizes"`
	BudgetMs  int    `json:"budget_ms"`
}

type testCase struct {
	Name     string    `json:"name"`
	Devices  int       `json:"devices"`
	Links    [][]any   `json:"links"`
	Requests []request `json:"requests"`
}

type step struct {
	Size   int     `json:"size"`
	Chosen []int   `json:"chosen"`
	Ms     float64 `json:"ms"`
	Runs   int     `json:"runs"`
}

type result struct {
	Case  string `json:"case"`
	ID    string `json:"id"`
	Steps []step `json:"steps"`
}

// link builds a P2PLink of a numeric type: the type lives in an internal
// package of go-gpuallocator, so it is set through reflection.
func link(to *gpuallocator.Device, linkType int) gpuallocator.P2PLink {
	l := gpuallocator.P2PLink{GPU: to}
	reflect.ValueOf(&l).Elem().FieldByName("Type").SetUint(uint64(linkType))
	return l
}

func buildDevices(c testCase) ([]*gpuallocator.Device, error) {
	devices := make([]*gpuallocator.Device, c.Devices)
	for i := range devices {
		devices[i] = &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
	}
	for _, raw := range c.Links {
		if len(raw) != 3 {
			return nil, fmt.Errorf("case %s: link %v is not [a, b, [types]]", c.Name, raw)
		}
		a, b := int(raw[0].(float64)), int(raw[1].(float64))
		for _, t := range raw[2].([]any) {
			lt := int(t.(float64))
			devices[a].Links[b] = append(devices[a].Links[b], link(devices[b], lt))
			devices[b].Links[a] = append(devices[b].Links[a], link(devices[a], lt))
		}
	}
	return devices, nil
}

func pick(devices []*gpuallocator.Device, indices []int) []*gpuallocator.Device {
	out := make([]*gpuallocator.Device, 0, len(indices))
	for _, i := range indices {
		out = append(out, devices[i])
	}
	return out
}

func run(devices []*gpuallocator.Device, req request) []step {
	policy := gpuallocator.NewBestEffortPolicy()
	available := append([]int{}, req.Available...)
	budget := time.Duration(req.BudgetMs) * time.Millisecond
	var steps []step
	for _, size := range req.Sizes {
		var chosen []*gpuallocator.Device
		var times []float64
		spent := time.Duration(0)
		// repeat fast calls for a stable median; a slow call runs once
		for len(times) == 0 || (spent < budget && len(times) < 1000) {
			start := time.Now()
			chosen = policy.Allocate(pick(devices, available), pick(devices, req.Required), size)
			took := time.Since(start)
			spent += took
			times = append(times, float64(took.Nanoseconds())/1e6)
		}
		sort.Float64s(times)
		indices := make([]int, 0, len(chosen))
		taken := map[int]bool{}
		for _, d := range chosen {
			indices = append(indices, d.Index)
			taken[d.Index] = true
		}
		sort.Ints(indices)
		steps = append(steps, step{Size: size, Chosen: indices, Ms: times[len(times)/2], Runs: len(times)})
		rest := available[:0:0]
		for _, i := range available {
			if !taken[i] {
				rest = append(rest, i)
			}
		}
		available = rest
		req.Required = nil // only the first step of a sequence has required devices
	}
	return steps
}

func main() {
	var input struct {
		Cases []testCase `json:"cases"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		fmt.Fprintln(os.Stderr, "error: cannot parse input:", err)
		os.Exit(2)
	}
	var results []result
	for _, c := range input.Cases {
		devices, err := buildDevices(c)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(2)
		}
		for _, req := range c.Requests {
			results = append(results, result{Case: c.Name, ID: req.ID, Steps: run(devices, req)})
		}
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"results": results}); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	}
}
