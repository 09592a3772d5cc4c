// Package browsertest drives a page in headless Chromium (chromedp) for
// tests: the console is collected (errors and exceptions), every action is
// bounded, and screenshots go to the test's temp dir. A test skips with a
// clear message when no Chromium binary is on PATH (.ci/run installs
// Debian's chromium).
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Timeout bounds each action.
const Timeout = 20 * time.Second

// Binaries are the names looked up on PATH, in order.
var Binaries = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"}

// Chromium returns the browser binary or skips the test.
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range Binaries {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium binary on PATH (apt-get install -y chromium): browser tests skipped")
	return ""
}

// Page is one headless tab.
type Page struct {
	t   testing.TB
	Ctx context.Context // a chromedp context whose browser runs
	Dir string          // where Shot writes

	mu   sync.Mutex
	errs []string
}

// Open starts Chromium (headless, no sandbox, no GPU, no background
// networking, GC exposed as window.gc), loads url, and, if ready is not
// empty, waits until the CSS selector ready is visible. The browser ends
// with the test.
func Open(t testing.TB, url, ready string) *Page {
	t.Helper()
	bin := Chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("js-flags", "--expose-gc"),
		chromedp.Flag("enable-precise-memory-info", true),
		chromedp.WindowSize(1400, 1100),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	p := &Page{t: t, Ctx: ctx, Dir: t.TempDir()}
	if err := chromedp.Do(ctx); err != nil { // the first Run starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Sprintf("%s %s:%d %s", m.Type, m.URL, m.Line+1, m.Text))
				p.mu.Unlock()
			}
		}
	}()
	steps := []chromedp.Action[chromedp.Void]{chromedp.Navigate(url)}
	if ready != "" {
		steps = append(steps, chromedp.WaitVisible(chromedp.CSS(ready)))
	}
	p.Do(steps...)
	return p
}

// Do runs actions, each call bounded by Timeout; on error it saves a
// screenshot "failure" and fails the test.
func (p *Page) Do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.Shot("failure")
		p.t.Fatal(err)
	}
}

// Text is the text content of the first element matching the CSS selector.
func (p *Page) Text(sel string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		p.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// Eval evaluates a JavaScript expression whose value is a number.
func (p *Page) Eval(js string) float64 {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[float64](js))
	if err != nil {
		p.t.Fatalf("eval %s: %v", js, err)
	}
	return v
}

// Shot saves a full-page PNG as Dir/name.png and returns its path ("" if
// it could not).
func (p *Page) Shot(name string) string {
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot: %v", err)
		return ""
	}
	path := filepath.Join(p.Dir, name+".png")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Logf("screenshot: %v", err)
		return ""
	}
	p.t.Logf("screenshot %s", path)
	return path
}

// ConsoleErrors are the console errors and uncaught exceptions so far.
func (p *Page) ConsoleErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// NoConsoleErrors fails the test if the page logged an error.
func (p *Page) NoConsoleErrors() {
	p.t.Helper()
	if errs := p.ConsoleErrors(); len(errs) > 0 {
		p.t.Fatalf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}
