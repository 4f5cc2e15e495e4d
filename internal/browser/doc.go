// Package browser starts headless Chromium for the tests of kubegpu's web
// page, driven by chromedp.
//
// Chromium is Debian's package (make deps installs it). A test that needs
// it fails when it is missing, unless KUBEGPU_SKIP_BROWSER=1 says to skip.
package browser
