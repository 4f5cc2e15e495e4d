// Package ui serves the page of `kubegpu ui`: a live view of the cluster's
// GPUs in a browser.
//
// The page and its script are embedded (no CDN: it works air-gapped). The
// server holds the latest View, each node's part as JSON, and streams it
// to every page as server-sent events: the whole view when a page
// connects, then only the nodes that changed and the summary. Everything
// the page shows is set as text, never as markup, and the page's Content
// Security Policy allows no inline script, so a string a node publishes
// (a model name, say) cannot run in the viewer's browser.
//
// Data needs the token the server prints in its URL: another local user
// who can reach the port cannot read what the caller's credentials can.
// The page keeps the token in the tab's session storage, which belongs to
// the page's origin alone (host and port), never in a cookie (which any
// port of the host would be sent).
package ui
