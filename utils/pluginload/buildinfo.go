package pluginload

import (
	"fmt"
	"runtime/debug"
	"slices"
)

// comparedSettings are the build settings that must match between a host
// and its plugins: each changes how shared packages compile.
var comparedSettings = []string{
	"-asan", "-asmflags", "-compiler", "-gcflags", "-msan", "-race", "-tags", "-trimpath",
	"CGO_ENABLED", "GOARCH", "GOOS", "GOEXPERIMENT",
	"GOAMD64", "GOARM", "GOARM64", "GO386", "GOMIPS", "GOMIPS64", "GOPPC64", "GORISCV64", "GOWASM",
}

// diffBuildInfo lists, one phrase each, how a plugin's build differs from
// its host's in ways that stop the Go runtime from loading it: the
// toolchain, the build settings in comparedSettings, and the version of every
// module both link. An empty result means the builds are compatible as far as
// build info can tell.
func diffBuildInfo(host, plug *debug.BuildInfo) []string {
	var diffs []string
	if host.GoVersion != plug.GoVersion {
		diffs = append(diffs, fmt.Sprintf("Go toolchain: host %s, plugin %s", host.GoVersion, plug.GoVersion))
	}
	hs, ps := settings(host), settings(plug)
	for _, key := range comparedSettings {
		if hs[key] != ps[key] {
			diffs = append(diffs, fmt.Sprintf("build setting %s: host %s, plugin %s", key, orUnset(hs[key]), orUnset(ps[key])))
		}
	}

	hostMods := modules(host)
	for path, pm := range modules(plug) {
		hm, ok := hostMods[path]
		if !ok {
			continue
		}
		if describe(hm) != describe(pm) {
			diffs = append(diffs, fmt.Sprintf("module %s: host %s, plugin %s", path, describe(hm), describe(pm)))
		}
	}
	// The same source tree built at two revisions: only build info with VCS
	// stamps can tell, and only for a clean tree.
	if host.Main.Path == plug.Main.Path && hs["vcs.revision"] != "" && ps["vcs.revision"] != "" &&
		(hs["vcs.revision"] != ps["vcs.revision"] || hs["vcs.modified"] != ps["vcs.modified"]) {
		diffs = append(diffs, fmt.Sprintf("source revision of %s: host %s (modified=%s), plugin %s (modified=%s)",
			host.Main.Path, hs["vcs.revision"], hs["vcs.modified"], ps["vcs.revision"], ps["vcs.modified"]))
	}
	slices.Sort(diffs)
	return diffs
}

func settings(bi *debug.BuildInfo) map[string]string {
	m := make(map[string]string, len(bi.Settings))
	for _, s := range bi.Settings {
		m[s.Key] = s.Value
	}
	return m
}

// modules maps module path to module for every module linked into the
// binary, except those whose identity build info cannot tell: a main module
// built from a working tree ("(devel)") and modules replaced by a local
// directory. For those the runtime's own package-hash check remains, and
// Open reports its refusal as a MismatchError too.
func modules(bi *debug.BuildInfo) map[string]*debug.Module {
	m := make(map[string]*debug.Module, len(bi.Deps)+1)
	if bi.Main.Path != "" && bi.Main.Version != "(devel)" && bi.Main.Version != "" {
		main := bi.Main
		m[main.Path] = &main
	}
	for _, d := range bi.Deps {
		if d.Replace != nil && d.Replace.Version == "" {
			continue
		}
		m[d.Path] = d
	}
	return m
}

// describe renders a module's identity: version, checksum and replacement.
func describe(m *debug.Module) string {
	s := m.Version
	if m.Sum != "" {
		s += " " + m.Sum
	}
	if r := m.Replace; r != nil {
		s += " => " + r.Path
		if r.Version != "" {
			s += " " + r.Version
		}
		if r.Sum != "" {
			s += " " + r.Sum
		}
	}
	return s
}

func orUnset(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}
