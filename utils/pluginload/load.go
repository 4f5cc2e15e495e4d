package pluginload

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"plugin"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/kubegpu/kubegpu/types"
)

// RebuildHint is the fix for every build mismatch.
const RebuildHint = `rebuild the binaries and the plugins together with "make build plugins"`

var (
	// ErrMismatch is wrapped by *MismatchError.
	ErrMismatch = errors.New("plugin built differently from its host")
	// ErrNotModule means the file is not a kubegpu device module: not a Go
	// plugin, or one without the ModuleSymbol constructor.
	ErrNotModule = errors.New("not a kubegpu device module")
)

// MismatchError says that a plugin and its host were not built together, and
// how their builds differ.
type MismatchError struct {
	// Plugin is the path of the .so.
	Plugin string
	// Host is the path of the running binary.
	Host string
	// Diffs describe each difference, e.g. "build setting -trimpath: host
	// true, plugin false".
	Diffs []string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("plugin %s was not built with %s: %s; %s",
		e.Plugin, e.Host, strings.Join(e.Diffs, "; "), RebuildHint)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Module is a loaded device module.
type Module struct {
	// Path is the .so it came from.
	Path string
	types.Module
}

// Load opens every *.so file in dir, in name order, and returns the modules
// they construct. The directory, the directories above it and the files
// must be owned by root (or the host's user), writable by no one else, and
// no symbolic links; with pins, every file must match its pin. Any file that
// fails fails the whole call, with an error per file; nothing is skipped in
// silence. A directory without plugins gives no modules and no error.
func Load(dir string, pins Pins) ([]Module, error) {
	mods, failures, err := LoadEach(dir, pins)
	if err != nil {
		return nil, err
	}
	if len(failures) > 0 {
		errs := make([]error, len(failures))
		for i, f := range failures {
			errs[i] = f
		}
		return nil, errors.Join(errs...)
	}
	return mods, nil
}

// FileError is a plugin file that did not load.
type FileError struct {
	// Path is the .so's path.
	Path string
	// Err says why; it names the file too.
	Err error
}

func (e *FileError) Error() string { return e.Err.Error() }

// Unwrap returns Err, so that errors.Is sees ErrMismatch, ErrNotModule and
// ErrUntrusted through a *FileError.
func (e *FileError) Unwrap() error { return e.Err }

// LoadEach is Load for a host that carries on without the files that fail:
// it returns the modules that loaded and a *FileError for each *.so that
// did not (untrusted, not matching its pin, built differently from the
// host, not a module, or a second file for one module), in name order.
// The error is for what fails every file: the directory (missing, or
// untrusted, as are its parents) or a pin naming no file.
func LoadEach(dir string, pins Pins) ([]Module, []*FileError, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, fmt.Errorf("open plugin directory: %w", err)
	}
	if err := checkDir(dir); err != nil {
		return nil, nil, err
	}
	for name, digest := range pins {
		if err := checkDigest(digest); err != nil {
			return nil, nil, fmt.Errorf("plugin pin for %s: %w", name, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			return nil, nil, fmt.Errorf("plugin pin for %s: no such module in %s", name, dir)
		}
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.so"))
	if err != nil {
		return nil, nil, fmt.Errorf("list plugins in %s: %w", dir, err)
	}
	var (
		mods     []Module
		failures []*FileError
	)
	byName := map[string]string{}
	for _, p := range paths {
		if err := checkFile(p, pins); err != nil {
			failures = append(failures, &FileError{Path: p, Err: err})
			continue
		}
		m, err := Open(p)
		if err != nil {
			failures = append(failures, &FileError{Path: p, Err: err})
			continue
		}
		if other, dup := byName[m.Name()]; dup {
			failures = append(failures, &FileError{Path: p, Err: fmt.Errorf("plugins %s and %s both provide module %q; remove one", other, p, m.Name())})
			continue
		}
		byName[m.Name()] = p
		mods = append(mods, Module{Path: p, Module: m})
	}
	return mods, failures, nil
}

// Open loads one plugin. Before handing the file to the Go runtime it checks
// that the plugin was built by the same toolchain, with the same settings
// and the same versions of the modules it shares with this binary, and
// reports any difference as a *MismatchError. A mismatch that build info
// cannot see (a shared package changed in the working tree) is caught by the
// runtime and reported the same way.
func Open(path string) (types.Module, error) {
	plugInfo, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w: cannot read Go build info (%w); build it with go build -buildmode=plugin", path, ErrNotModule, err)
	}
	hostInfo, ok := debug.ReadBuildInfo()
	if !ok {
		return nil, fmt.Errorf("plugin %s: this binary has no Go build info to compare with", path)
	}
	if diffs := diffBuildInfo(hostInfo, plugInfo); len(diffs) > 0 {
		return nil, &MismatchError{Plugin: path, Host: hostName(), Diffs: diffs}
	}

	p, err := plugin.Open(path)
	if err != nil {
		if pkg := differentPackage(err); pkg != "" {
			return nil, &MismatchError{Plugin: path, Host: hostName(),
				Diffs: []string{fmt.Sprintf("package %s differs (the source changed between the two builds)", pkg)}}
		}
		if strings.Contains(err.Error(), "plugin already loaded") {
			return nil, fmt.Errorf("plugin %s: open: %w: it is a copy of a plugin this process already loaded from another path; keep one copy in the plugin directory", path, err)
		}
		return nil, fmt.Errorf("plugin %s: open: %w", path, err)
	}
	sym, err := p.Lookup(types.ModuleSymbol)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w: it does not export %s (want func %s() types.Module)", path, ErrNotModule, types.ModuleSymbol, types.ModuleSymbol)
	}
	ctor, ok := sym.(types.ModuleConstructor)
	if !ok {
		return nil, fmt.Errorf("plugin %s: %w: %s is a %T, want func() types.Module", path, ErrNotModule, types.ModuleSymbol, sym)
	}
	m := ctor()
	if m == nil || m.Name() == "" {
		return nil, fmt.Errorf("plugin %s: %w: %s returned a module without a name", path, ErrNotModule, types.ModuleSymbol)
	}
	return m, nil
}

// differentPackageRE matches the Go runtime's refusal to load a plugin that
// shares a package with the host but was compiled from other source.
var differentPackageRE = regexp.MustCompile(`plugin was built with a different version of package (\S+)`)

func differentPackage(err error) string {
	if m := differentPackageRE.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	return ""
}

func hostName() string {
	exe, err := os.Executable()
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	return exe
}

// Names returns the modules' names, sorted.
func Names(mods []Module) []string {
	out := make([]string, len(mods))
	for i, m := range mods {
		out[i] = m.Name()
	}
	slices.Sort(out)
	return out
}
