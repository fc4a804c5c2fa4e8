// cdi-validate: the CDI library's own reading of CDI spec files, for the
// tests of metax.gpu's spec generator (test infrastructure, never shipped).
//
//	cdi-validate FILE...          one JSON object per file: valid, error,
//	                              cdiVersion, minimumVersion, devices
//	cdi-validate -inject DIR NAME...
//	                              the OCI edits the library makes for the
//	                              fully qualified device NAMEs of the specs
//	                              in DIR: env, mounts, linux devices
//
// Exit status: 0 when every file is valid (or the injection worked), 1 otherwise.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

type result struct {
	Path           string   `json:"path"`
	Valid          bool     `json:"valid"`
	Error          string   `json:"error,omitempty"`
	Version        string   `json:"cdiVersion,omitempty"`
	MinimumVersion string   `json:"minimumVersion,omitempty"`
	Devices        []string `json:"devices,omitempty"`
}

func validate(path string) result {
	r := result{Path: path}
	data, err := os.ReadFile(path)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if raw, err := cdi.ParseSpec(data); err == nil && raw != nil {
		r.Version = raw.Version
		r.MinimumVersion, _ = specs.MinimumRequiredVersion(raw)
	}
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Valid = true
	for _, d := range spec.Devices {
		r.Devices = append(r.Devices, spec.Kind+"="+d.Name)
	}
	return r
}

func inject(dir string, names []string) int {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err == nil {
		err = cache.Refresh()
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, e)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(ociSpec, names...); err != nil {
		fmt.Fprintf(os.Stderr, "unresolved %v: %v\n", unresolved, err)
		return 1
	}
	out := map[string]any{"env": ociSpec.Process.Env, "mounts": ociSpec.Mounts, "devices": ociSpec.Linux.Devices}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-inject" {
		os.Exit(inject(os.Args[2], os.Args[3:]))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate FILE... | cdi-validate -inject DIR NAME...")
		os.Exit(2)
	}
	status := 0
	results := []result{}
	for _, path := range os.Args[1:] {
		r := validate(path)
		if !r.Valid {
			status = 1
		}
		results = append(results, r)
	}
	_ = json.NewEncoder(os.Stdout).Encode(results)
	os.Exit(status)
}
