// Package version reports the build's version. The Makefile sets gitVersion
// with -ldflags "-X github.com/kubegpu/kubegpu/utils/version.gitVersion=...";
// other builds report "v0.0.0-dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

var gitVersion = "v0.0.0-dev"

// Info describes the running binary.
type Info struct {
	GitVersion string `json:"gitVersion"`
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"`
}

// Get returns the running binary's version information.
func Get() Info {
	goVersion := runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
	}
	return Info{GitVersion: gitVersion, GoVersion: goVersion, Platform: runtime.GOOS + "/" + runtime.GOARCH}
}

func (i Info) String() string {
	return fmt.Sprintf("%s (%s, %s)", i.GitVersion, i.GoVersion, i.Platform)
}
