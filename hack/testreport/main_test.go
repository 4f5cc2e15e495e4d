package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// ev is one line of go test -json.
func ev(action, pkg, test, output string) string {
	return fmt.Sprintf(`{"Action":%q,"Package":%q,"Test":%q,"Output":%q}`, action, pkg, test, output)
}

// out is an output event of package p (test "" for the package's own).
func out(p, test string, lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(ev("output", p, test, l+"\n") + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

const (
	pa = "example.com/m/a"
	pb = "example.com/m/b"
	pc = "example.com/m/c"
)

// stream is go test -json of three packages, as go test interleaves them:
// a passes (one test skipped with a reason, a subtest skipped, one
// without a reason), b fails (a subtest fails, one passes), c has no test
// files; the go command prints an error of its own.
var stream = strings.Join([]string{
	ev("start", pa, "", ""),
	ev("start", pb, "", ""),
	out(pa, "TestPass", "=== RUN   TestPass", "    a_test.go:5: noise", "--- PASS: TestPass (0.00s)"),
	ev("pass", pa, "TestPass", ""),
	out(pb, "TestFail", "=== RUN   TestFail", "    b_test.go:10: before"),
	out(pa, "TestSkip", "=== RUN   TestSkip", "    a_test.go:7: first log", "    a_test.go:8: needs KUBEGPU_BIN_DIR", "        (make integration)", "--- SKIP: TestSkip (0.00s)"),
	ev("skip", pa, "TestSkip", ""),
	out(pa, "TestSub/y", "=== RUN   TestSub/y", "    a_test.go:17: y is skipped", "--- SKIP: TestSub/y (0.00s)"),
	ev("skip", pa, "TestSub/y", ""),
	out(pa, "TestSub", "--- PASS: TestSub (0.00s)"),
	ev("pass", pa, "TestSub", ""),
	out(pa, "TestSkipNow", "=== RUN   TestSkipNow", "--- SKIP: TestSkipNow (0.00s)"),
	ev("skip", pa, "TestSkipNow", ""),
	out(pb, "TestFail/inner", "=== RUN   TestFail/inner", "    b_test.go:11: inner broke", "--- FAIL: TestFail/inner (0.00s)"),
	ev("fail", pb, "TestFail/inner", ""),
	out(pb, "TestFail/good", "=== RUN   TestFail/good", "    b_test.go:12: good sub", "--- PASS: TestFail/good (0.00s)"),
	ev("pass", pb, "TestFail/good", ""),
	out(pb, "TestFail", "=== NAME  TestFail", "    b_test.go:14: outer broke", "--- FAIL: TestFail (0.00s)"),
	ev("fail", pb, "TestFail", ""),
	out(pa, "", "PASS", "ok  \texample.com/m/a\t0.1s"),
	ev("pass", pa, "", ""),
	"go: warning: something of the go command's own",
	out(pb, "", "FAIL", "FAIL\texample.com/m/b\t0.2s"),
	ev("fail", pb, "", ""),
	ev("start", pc, "", ""),
	out(pc, "", "?   \texample.com/m/c\t[no test files]"),
	ev("skip", pc, "", ""),
}, "\n") + "\n"

func TestReport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		verbose bool
		want    string
	}{{
		name: "as go test prints",
		want: `ok  	example.com/m/a	0.1s
go: warning: something of the go command's own
    b_test.go:10: before
    b_test.go:11: inner broke
    --- FAIL: TestFail/inner (0.00s)
    b_test.go:14: outer broke
--- FAIL: TestFail (0.00s)
FAIL
FAIL	example.com/m/b	0.2s
?   	example.com/m/c	[no test files]
FAIL
`,
	}, {
		name:    "as go test -v prints",
		verbose: true,
		want: `=== RUN   TestPass
    a_test.go:5: noise
--- PASS: TestPass (0.00s)
=== RUN   TestSkip
    a_test.go:7: first log
    a_test.go:8: needs KUBEGPU_BIN_DIR
        (make integration)
--- SKIP: TestSkip (0.00s)
=== RUN   TestSub/y
    a_test.go:17: y is skipped
    --- SKIP: TestSub/y (0.00s)
--- PASS: TestSub (0.00s)
=== RUN   TestSkipNow
--- SKIP: TestSkipNow (0.00s)
PASS
ok  	example.com/m/a	0.1s
go: warning: something of the go command's own
=== RUN   TestFail
    b_test.go:10: before
=== RUN   TestFail/inner
    b_test.go:11: inner broke
    --- FAIL: TestFail/inner (0.00s)
=== RUN   TestFail/good
    b_test.go:12: good sub
    --- PASS: TestFail/good (0.00s)
=== NAME  TestFail
    b_test.go:14: outer broke
--- FAIL: TestFail (0.00s)
FAIL
FAIL	example.com/m/b	0.2s
?   	example.com/m/c	[no test files]
FAIL
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got, skips bytes.Buffer
			r := newReport(&got, tc.verbose, "example.com/m/")
			r.skips = &skips
			r.run(strings.NewReader(stream))
			if got.String() != tc.want {
				t.Errorf("output:\n%s\nwant:\n%s", got.String(), tc.want)
			}
			wantSkips := `  a TestSkip (a_test.go:8): needs KUBEGPU_BIN_DIR (make integration)
  a TestSub/y (a_test.go:17): y is skipped
  a TestSkipNow: (no reason given)
`
			if skips.String() != wantSkips {
				t.Errorf("skips:\n%s\nwant:\n%s", skips.String(), wantSkips)
			}
		})
	}
}

// TestUnfinished: a package go test never finished (killed) is printed
// whole, as a failure.
func TestUnfinished(t *testing.T) {
	var got bytes.Buffer
	newReport(&got, false, "").run(strings.NewReader(strings.Join([]string{
		ev("start", pa, "", ""),
		out(pa, "TestPass", "=== RUN   TestPass", "--- PASS: TestPass (0.00s)"),
		ev("pass", pa, "TestPass", ""),
		out(pa, "TestHang", "=== RUN   TestHang", "panic: test timed out after 1s"),
	}, "\n")))
	if want := "panic: test timed out after 1s\nFAIL\n"; got.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", got.String(), want)
	}
}
