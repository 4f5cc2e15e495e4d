package admission

import "embed"

// templateFiles holds the policies' text/templates: one *.yaml.tmpl per
// generated file, and the named templates they share (common.tmpl,
// share.tmpl). All are parsed together, with funcs.
//
//go:embed templates/*.tmpl
var templateFiles embed.FS

// The generated files' templates, by name in templateFiles.
const (
	policiesTemplate        = "kubegpu-policies.yaml.tmpl"
	secondSchedulerTemplate = "second-scheduler.yaml.tmpl"
)
