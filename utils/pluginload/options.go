package pluginload

import (
	"fmt"
	"strings"
)

// Options holds each module's options, by module name and then key.
type Options map[string]map[string]string

// ParseOptions parses flags of the form NAME.KEY=VALUE (e.g.
// "simgpu.preset=dgx1") into Options.
func ParseOptions(flags []string) (Options, error) {
	opts := Options{}
	for _, f := range flags {
		nameKey, value, ok := strings.Cut(f, "=")
		name, key, ok2 := strings.Cut(nameKey, ".")
		if !ok || !ok2 || name == "" || key == "" {
			return nil, fmt.Errorf("plugin option %q: want MODULE.KEY=VALUE, e.g. simgpu.preset=dgx1", f)
		}
		if opts[name] == nil {
			opts[name] = map[string]string{}
		}
		if _, dup := opts[name][key]; dup {
			return nil, fmt.Errorf("plugin option %s.%s is set twice", name, key)
		}
		opts[name][key] = value
	}
	return opts, nil
}

// CheckModules returns an error if an option names a module that was not
// loaded: a misspelt name or a missing .so.
func (o Options) CheckModules(mods []Module) error {
	loaded := map[string]bool{}
	for _, m := range mods {
		loaded[m.Name()] = true
	}
	for name := range o {
		if !loaded[name] {
			return fmt.Errorf("plugin options name module %q, which is not loaded (loaded: %s)", name, strings.Join(orNone(Names(mods)), ", "))
		}
	}
	return nil
}

func orNone(s []string) []string {
	if len(s) == 0 {
		return []string{"none"}
	}
	return s
}
