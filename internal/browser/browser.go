package browser

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// SkipVar names the variable that skips the browser tests where Chromium
// is missing.
const SkipVar = "KUBEGPU_SKIP_BROWSER"

// Path is the Chromium to run: $KUBEGPU_CHROMIUM, else chromium on PATH.
func Path() (string, error) {
	if p := os.Getenv("KUBEGPU_CHROMIUM"); p != "" {
		return p, nil
	}
	return exec.LookPath("chromium")
}

// New starts a headless Chromium for t, with a fresh profile, and returns
// a chromedp context of one tab; both end with the test.
func New(t testing.TB) context.Context {
	t.Helper()
	path, err := Path()
	if err != nil {
		if os.Getenv(SkipVar) == "1" {
			t.Skipf("no Chromium (%v), and %s=1", err, SkipVar)
		}
		t.Fatalf("the browser tests need Chromium (make deps installs Debian's chromium; or set KUBEGPU_CHROMIUM, or %s=1 to skip them): %v", SkipVar, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1150),
		// This machine's network is closed: Chromium's own connections
		// would only be refused.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses its sandbox to root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium %s: %v", path, err)
	}
	return ctx
}

// Wait polls a JavaScript condition in the page until it holds, and fails
// the test, printing what the page shows, when within has passed.
func Wait(ctx context.Context, t testing.TB, within time.Duration, cond string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		if err != nil {
			t.Fatalf("evaluate %s: %v", cond, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("the page did not show %s within %s; it shows:\n%s", cond, within, text)
		}
		time.Sleep(25 * time.Millisecond) // the poll's step
	}
}
