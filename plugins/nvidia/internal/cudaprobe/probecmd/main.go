// Command probecmd runs the CUDA probe once: memory information, the
// allocations asked for (each kept until the end, so they add up), and the
// compute-bound kernel's rate; it prints one JSON object.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/plugins/nvidia/internal/cudaprobe"
)

type allocResult struct {
	MiB   uint64 `json:"mib"`
	OK    bool   `json:"ok"`
	OOM   bool   `json:"oom,omitempty"`
	Error string `json:"error,omitempty"`
}

type result struct {
	SMs        int           `json:"sms"`
	FreeMiB    uint64        `json:"freeMiB"`
	TotalMiB   uint64        `json:"totalMiB"`
	Allocs     []allocResult `json:"allocs,omitempty"`
	GFMAPerSec float64       `json:"gfmaPerSec,omitempty"`
	Error      string        `json:"error,omitempty"`
}

func main() {
	allocs := flag.String("alloc", "", "comma-separated MiB to allocate, kept until the end")
	spin := flag.Duration("spin", 0, "time the kernel for this long")
	flag.Parse()
	var r result
	defer func() {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}()
	d, err := cudaprobe.Open("", 0)
	if err != nil {
		r.Error = err.Error()
		return
	}
	r.SMs = d.SMs
	free, total, err := d.MemInfo()
	r.FreeMiB, r.TotalMiB = free>>20, total>>20
	if err != nil {
		r.Error = err.Error()
		return
	}
	for _, f := range strings.FieldsFunc(*allocs, func(c rune) bool { return c == ',' }) {
		mib, _ := strconv.ParseUint(f, 10, 64)
		_, err := d.Alloc(mib << 20)
		a := allocResult{MiB: mib, OK: err == nil, OOM: errors.Is(err, cudaprobe.ErrOutOfMemory)}
		if err != nil {
			a.Error = err.Error()
		}
		r.Allocs = append(r.Allocs, a)
	}
	if *spin > 0 {
		rate, err := d.Spin(*spin)
		r.GFMAPerSec = rate
		if err != nil {
			r.Error = err.Error()
		}
	}
}
