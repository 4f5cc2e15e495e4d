package alertrules

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// FileName is the rule file's path in the checkout.
var FileName = filepath.Join("deploy", "prometheus", "kubegpu-alerts.yaml")

// File finds the rule file above the working directory (a test's package
// directory in the checkout).
func File() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find alert rules: %w", err)
	}
	for {
		p := filepath.Join(dir, FileName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find alert rules: no %s above the working directory", FileName)
		}
		dir = parent
	}
}

// ReadFile reads the rules of the checkout's rule file (see File).
func ReadFile() ([]Rule, error) {
	p, err := File()
	if err != nil {
		return nil, err
	}
	return Read(p)
}

// Rule is one alerting rule: its name and expression.
type Rule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
}

// Read returns the rules of the rule file at path.
func Read(path string) ([]Rule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read alert rules: %w", err)
	}
	var f struct {
		Groups []struct {
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("read alert rules %s: %w", path, err)
	}
	var out []Rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// Selector is one series selector of an expression.
type Selector struct {
	// Text is the selector as written.
	Text   string
	Metric string
	// Matchers are its label matchers, in order.
	Matchers []Matcher
}

// Matcher is one label matcher: label, operator (=, !=, =~, !~) and value.
type Matcher struct {
	Label, Op, Value string
}

var (
	// selector is a metric name of kubegpu's components (its own, the
	// scheduler's leader election, up) and its matchers, if any.
	selector = regexp.MustCompile(`\b(kubegpu_[a-z0-9_]+|leader_election_master_status|up)\b(\{[^}]*\})?`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// Selectors returns the selectors of expr.
func Selectors(expr string) []Selector {
	var out []Selector
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		s := Selector{Text: m[0], Metric: m[1]}
		for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
			s.Matchers = append(s.Matchers, Matcher{Label: l[1], Op: l[2], Value: l[3]})
		}
		out = append(out, s)
	}
	return out
}

// HasJob reports whether s selects a job with = or =~.
func (s Selector) HasJob() bool {
	for _, m := range s.Matchers {
		if m.Label == "job" && (m.Op == "=" || m.Op == "=~") && m.Value != "" {
			return true
		}
	}
	return false
}

// Unscoped returns the selectors of expr that select no job, and so match
// series of any scraped target.
func Unscoped(expr string) []string {
	var out []string
	for _, s := range Selectors(expr) {
		if !s.HasJob() {
			out = append(out, s.Text)
		}
	}
	return out
}

// LabelValues returns the values that the matchers on label of metric's
// selectors in rules name: an equality's or inequality's value, and each
// alternative of a regular expression of plain alternatives (a|b|c).
func LabelValues(rules []Rule, metric, label string) []string {
	var out []string
	for _, r := range rules {
		for _, s := range Selectors(r.Expr) {
			if s.Metric != metric {
				continue
			}
			for _, m := range s.Matchers {
				if m.Label != label {
					continue
				}
				if m.Op == "=~" || m.Op == "!~" {
					out = append(out, strings.Split(m.Value, "|")...)
				} else {
					out = append(out, m.Value)
				}
			}
		}
	}
	return out
}
