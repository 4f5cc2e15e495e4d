package main

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

type results struct {
	passed, failed []string
	skipped        int
	ran            map[string]bool
}

// readJUnit reads ginkgo's JUnit report: spec names by outcome, suite
// set-up nodes left out.
func readJUnit(path string) (*results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var report struct {
		Suites []struct {
			Cases []struct {
				Name   string `xml:"name,attr"`
				Status string `xml:"status,attr"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &report); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	res := &results{ran: map[string]bool{}}
	for _, s := range report.Suites {
		for _, c := range s.Cases {
			name := strings.TrimPrefix(c.Name, "[It] ")
			if strings.HasPrefix(c.Name, "[") && !strings.HasPrefix(c.Name, "[It]") {
				continue // [BeforeSuite], [SynchronizedAfterSuite], ...
			}
			switch c.Status {
			case "passed":
				res.passed = append(res.passed, name)
				res.ran[name] = true
			case "failed", "panicked", "timedout", "interrupted", "aborted":
				res.failed = append(res.failed, name)
				res.ran[name] = true
			default:
				res.skipped++
			}
		}
	}
	sort.Strings(res.failed)
	return res, nil
}

// readKnownFailures reads one spec name a line; # starts a comment.
func readKnownFailures(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return map[string]bool{}, nil
		}
		return nil, err
	}
	defer f.Close()
	known := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			known[line] = true
		}
	}
	return known, sc.Err()
}
