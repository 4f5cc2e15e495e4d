// Command testreport reads `go test -json` on its standard input and prints
// what go test prints without -json, and keeps the list of the tests that
// skipped, with the reason each gave, for `make test` to print at its end.
//
// Without -v it prints what plain `go test` prints: the summary line of each
// package that passes, and the whole output of each that fails (its own and
// that of its failed tests). With -v it prints every line, as `go test -v`
// prints them, each package's lines together once it has finished. Lines
// that are not go test's JSON (the go command's own errors) pass through
// at once. -skips FILE appends one line per skipped test to FILE.
//
// It exits 0 whatever the tests did: go test's exit status is the verdict,
// passed on by the shell's pipefail.
//
// Usage:
//
//	go test -json ./... | testreport -trim github.com/kubegpu/kubegpu/ -skips _output/test-skips/unit.txt
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	verbose := flag.Bool("v", false, "print every line, as go test -v does")
	skips := flag.String("skips", "", "append the skipped tests to this file")
	trim := flag.String("trim", "", "import path prefix left out of the package names in the skipped tests")
	flag.Parse()
	r := newReport(os.Stdout, *verbose, *trim)
	if *skips != "" {
		f, err := os.OpenFile(*skips, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			// The tests still run and print; only the list is lost.
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		} else {
			defer f.Close()
			r.skips = f
		}
	}
	r.run(os.Stdin)
}

// event is one line of go test -json (cmd/test2json's TestEvent, and the
// go command's build events).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// line is one piece of a package's output, and the test it belongs to.
type line struct {
	test, text string
}

type pkgState struct {
	lines []line
	// result is each test's last action: pass, fail or skip.
	result map[string]string
}

type report struct {
	out     io.Writer
	skips   io.Writer
	verbose bool
	trim    string
	pkgs    map[string]*pkgState
	// failed: some package failed, so go test ends with a line "FAIL".
	failed bool
	// order is the packages in the order they started, for those left
	// unfinished at the end of the input.
	order []string
}

func newReport(out io.Writer, verbose bool, trim string) *report {
	return &report{out: out, verbose: verbose, trim: trim, pkgs: map[string]*pkgState{}}
}

func (r *report) run(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	for sc.Scan() {
		r.handle(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: read: %v\n", err)
	}
	// Packages go test never finished (it was killed): everything they
	// said, as for a failure.
	for _, name := range r.order {
		if p, ok := r.pkgs[name]; ok {
			r.flush(p, "fail")
			delete(r.pkgs, name)
		}
	}
	if r.failed {
		fmt.Fprintln(r.out, "FAIL")
	}
}

func (r *report) handle(raw []byte) {
	var e event
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &e) != nil || (e.Action == "" && e.ImportPath == "") {
		fmt.Fprintf(r.out, "%s\n", raw)
		return
	}
	switch {
	case e.Action == "build-output":
		// Compiler errors: go test prints them at once.
		fmt.Fprint(r.out, e.Output)
		return
	case e.Package == "":
		fmt.Fprint(r.out, e.Output)
		return
	}
	p := r.pkgs[e.Package]
	if p == nil {
		p = &pkgState{result: map[string]string{}}
		r.pkgs[e.Package] = p
		r.order = append(r.order, e.Package)
	}
	switch e.Action {
	case "output":
		p.lines = append(p.lines, line{e.Test, indent(e.Test, e.Output)})
	case "pass", "fail", "skip":
		if e.Test != "" {
			p.result[e.Test] = e.Action
			if e.Action == "skip" {
				r.skipped(e.Package, e.Test, p)
			}
			return
		}
		r.flush(p, e.Action)
		delete(r.pkgs, e.Package)
	}
}

// flush prints a finished package's output as go test would.
func (r *report) flush(p *pkgState, result string) {
	if result == "fail" {
		r.failed = true
	}
	switch {
	case r.verbose:
		for _, l := range p.lines {
			fmt.Fprint(r.out, l.text)
		}
	case result == "pass":
		// Only the summary ("ok  \tpkg\t0.1s"), unless there is none.
		var summary []string
		for _, l := range p.lines {
			if l.test == "" && strings.HasPrefix(l.text, "ok") {
				summary = append(summary, l.text)
			}
		}
		if summary == nil {
			r.printOwn(p, func(string) bool { return true })
		}
		for _, s := range summary {
			fmt.Fprint(r.out, s)
		}
	case result == "skip":
		// "?   \tpkg\t[no test files]"
		r.printOwn(p, func(string) bool { return false })
	default:
		// The package's own lines, and those of every test that did
		// not pass or skip (failed, or never finished).
		r.printOwn(p, func(test string) bool {
			res := p.result[test]
			return res != "pass" && res != "skip"
		})
	}
}

// printOwn prints the package's own lines, and those of the tests keep
// says, without go test -v's lines that mark where a test runs.
func (r *report) printOwn(p *pkgState, keep func(test string) bool) {
	for _, l := range p.lines {
		if l.test != "" && (!keep(l.test) || framing(l.text)) {
			continue
		}
		fmt.Fprint(r.out, l.text)
	}
}

// framing reports whether text is one of go test -v's lines that say which
// test runs, pauses or continues.
func framing(text string) bool {
	for _, prefix := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(text, prefix) {
			return true
		}
	}
	return false
}

// indent indents a subtest's result line ("--- PASS: TestA/b (0.00s)") by
// four spaces a level, as go test -v prints it under its parent's; go test
// -json gives it unindented.
func indent(test, text string) string {
	depth := strings.Count(test, "/")
	if depth == 0 || !strings.HasPrefix(text, "--- ") {
		return text
	}
	return strings.Repeat("    ", depth) + text
}

// logHeader matches the first line of a t.Log entry: "    x_test.go:12: ".
var logHeader = regexp.MustCompile(`^\s*([^\s:]+\.go:\d+): ?(.*)$`)

// skipped appends test's line to the skips: the package, the test, and
// the last thing it logged (its t.Skip message) with where it said it.
func (r *report) skipped(pkg, test string, p *pkgState) {
	if r.skips == nil {
		return
	}
	var said []string
	for _, l := range p.lines {
		if l.test != test || framing(l.text) || strings.HasPrefix(strings.TrimSpace(l.text), "--- SKIP: ") {
			continue
		}
		for _, s := range strings.Split(strings.TrimRight(l.text, "\n"), "\n") {
			if logHeader.MatchString(s) {
				said = said[:0] // a later entry: keep the last one only
			}
			said = append(said, s)
		}
	}
	reason, where := "(no reason given)", ""
	if len(said) > 0 {
		if m := logHeader.FindStringSubmatch(said[0]); m != nil {
			where, said[0] = m[1], m[2]
		}
		for i := range said {
			said[i] = strings.TrimSpace(said[i])
		}
		if s := strings.TrimSpace(strings.Join(said, " ")); s != "" {
			reason = s
		}
	}
	if where != "" {
		test += " (" + where + ")"
	}
	fmt.Fprintf(r.skips, "  %s %s: %s\n", strings.TrimPrefix(pkg, r.trim), test, reason)
}
