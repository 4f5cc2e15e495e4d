package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// NodeSpec is one line of a node list: sn,cpu_milli,memory_mib,gpu,model.
type NodeSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// PodSpec is one line of a pod list. Only the first five columns are
// required; gpu_spec lists the GPU models the pod may use, separated by '|'.
type PodSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	NumGPU    int
	GPUMilli  int32 // per GPU, 0..1000
	GPUSpec   []string
}

// TotalGPUMilli is the GPU share the pod asks for in all.
func (p PodSpec) TotalGPUMilli() int64 { return int64(p.GPUMilli) * int64(p.NumGPU) }

// ErrMalformed is wrapped by every trace parse error.
var ErrMalformed = errors.New("malformed trace")

// TraceError locates a problem in a trace file.
type TraceError struct {
	File   string
	Line   int
	Column int    // 1-based; 0 for the whole line
	Name   string // the column's name, when known
	Err    error
}

func (e *TraceError) Error() string {
	switch {
	case e.Column > 0 && e.Name != "":
		return fmt.Sprintf("%s:%d:%d (column %s): %v", e.File, e.Line, e.Column, e.Name, e.Err)
	case e.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %v", e.File, e.Line, e.Column, e.Err)
	default:
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
}

func (e *TraceError) Unwrap() []error { return []error{ErrMalformed, e.Err} }

var (
	nodeColumns = []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}
	podColumns  = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
)

// Limits on trace values, so that a corrupt file fails loudly.
const (
	maxTraceCPU    = 1 << 40
	maxTraceMemory = 1 << 40
	maxTraceGPUs   = 64
)

// ReadNodes reads a node list CSV file.
func ReadNodes(path string) ([]NodeSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read node list: %w", err)
	}
	defer f.Close()
	return ParseNodes(path, f)
}

// ParseNodes parses a node list; name is used in errors.
func ParseNodes(name string, r io.Reader) ([]NodeSpec, error) {
	var out []NodeSpec
	seen := map[string]int{}
	err := parse(name, r, nodeColumns, func(row *row) error {
		n := NodeSpec{
			Name:      row.str("sn"),
			CPUMilli:  row.int("cpu_milli", 0, maxTraceCPU),
			MemoryMiB: row.int("memory_mib", 0, maxTraceMemory),
			GPUs:      int(row.int("gpu", 0, maxTraceGPUs)),
			Model:     row.str("model"),
		}
		if row.err != nil {
			return row.err
		}
		if n.Name == "" {
			return row.fail("sn", errors.New("the node name is empty"))
		}
		if line, dup := seen[n.Name]; dup {
			return row.fail("sn", fmt.Errorf("node %q is also on line %d", n.Name, line))
		}
		if n.GPUs > 0 && n.Model == "" {
			return row.fail("model", fmt.Errorf("a node with %d GPUs needs a model", n.GPUs))
		}
		seen[n.Name] = row.line
		out = append(out, n)
		return nil
	})
	return out, err
}

// ReadPods reads a pod list CSV file.
func ReadPods(path string) ([]PodSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read pod list: %w", err)
	}
	defer f.Close()
	return ParsePods(path, f)
}

// ParsePods parses a pod list; name is used in errors. gpu_milli above 1000
// is read as 1000, as the trace's own tools do.
func ParsePods(name string, r io.Reader) ([]PodSpec, error) {
	var out []PodSpec
	err := parse(name, r, podColumns, func(row *row) error {
		p := PodSpec{
			Name:      row.str("name"),
			CPUMilli:  row.int("cpu_milli", 0, maxTraceCPU),
			MemoryMiB: row.int("memory_mib", 0, maxTraceMemory),
			NumGPU:    int(row.int("num_gpu", 0, maxTraceGPUs)),
		}
		milli := row.int("gpu_milli", 0, 1<<31-1)
		if row.err != nil {
			return row.err
		}
		if p.Name == "" {
			return row.fail("name", errors.New("the pod name is empty"))
		}
		if p.NumGPU > 0 {
			p.GPUMilli = int32(min(milli, 1000))
			if p.GPUMilli == 0 {
				return row.fail("gpu_milli", fmt.Errorf("a pod with %d GPUs needs gpu_milli 1..1000", p.NumGPU))
			}
			if p.NumGPU > 1 && p.GPUMilli < 1000 {
				return row.fail("gpu_milli", fmt.Errorf("a pod with %d GPUs must take them whole (gpu_milli 1000), got %d", p.NumGPU, milli))
			}
		}
		if spec, ok := row.opt("gpu_spec"); ok {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m != "" {
					p.GPUSpec = append(p.GPUSpec, m)
				}
			}
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// row is one CSV record with typed accessors that remember the first error.
type row struct {
	file    string
	line    int
	fields  []string
	columns map[string]int
	err     error
}

// note records err against column col, unless an earlier error is recorded.
func (r *row) note(col string, err error) {
	if r.err != nil {
		return
	}
	e := &TraceError{File: r.file, Line: r.line, Name: col, Err: err}
	if i, ok := r.columns[col]; ok {
		e.Column = i + 1
	}
	r.err = e
}

// fail records err against column col and returns the row's first error.
func (r *row) fail(col string, err error) error {
	r.note(col, err)
	return r.err
}

func (r *row) str(col string) string {
	return strings.TrimSpace(r.fields[r.columns[col]])
}

func (r *row) opt(col string) (string, bool) {
	i, ok := r.columns[col]
	if !ok {
		return "", false
	}
	return strings.TrimSpace(r.fields[i]), true
}

func (r *row) int(col string, lo, hi int64) int64 {
	s := r.str(col)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		r.note(col, fmt.Errorf("want an integer, got %q", s))
		return 0
	}
	if v < lo || v > hi {
		r.note(col, fmt.Errorf("want %d..%d, got %d", lo, hi, v))
		return 0
	}
	return v
}

// parse reads a CSV file with a header naming at least the required
// columns, in any order, and calls each for every record.
func parse(name string, rd io.Reader, required []string, each func(*row) error) error {
	cr := csv.NewReader(rd)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return &TraceError{File: name, Line: 1, Err: fmt.Errorf("empty file; want a header with %s", strings.Join(required, ","))}
		}
		return csvError(name, err)
	}
	columns := map[string]int{}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := columns[h]; dup {
			return &TraceError{File: name, Line: 1, Column: i + 1, Name: h, Err: errors.New("column appears twice in the header")}
		}
		columns[h] = i
	}
	for _, c := range required {
		if _, ok := columns[c]; !ok {
			return &TraceError{File: name, Line: 1, Err: fmt.Errorf("header lacks column %q; want at least %s", c, strings.Join(required, ","))}
		}
	}
	for {
		fields, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return csvError(name, err)
		}
		line, _ := cr.FieldPos(0)
		r := &row{file: name, line: line, fields: fields, columns: columns}
		if err := each(r); err != nil {
			return err
		}
	}
}

func csvError(name string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &TraceError{File: name, Line: pe.Line, Column: pe.Column, Err: pe.Err}
	}
	return &TraceError{File: name, Err: err}
}
