// Package alertrules reads kubegpu's Prometheus rule file
// (deploy/prometheus/kubegpu-alerts.yaml) for the tests that hold its
// expressions against what kubegpu's components export: the label values
// the rules match, and that every series selector names its job.
//
// It reads PromQL with regular expressions, enough for the selectors the
// rule file writes (metric{label="v", label=~"a|b"}); it is not a PromQL
// parser.
package alertrules
