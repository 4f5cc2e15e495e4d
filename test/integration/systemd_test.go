package integration

import (
	"slices"
	"strings"
	"testing"
)

// The test machine has no systemd. These read what install.sh writes as
// systemd does (systemd.exec(5), "EnvironmentFile="; systemd.service(5),
// "Command lines"), so that the tests run the shim with the arguments
// systemd would give it.

// systemdEnvFile returns the assignments of an EnvironmentFile: lines of
// NAME=VALUE, "#" and ";" lines ignored. An unquoted value keeps its
// characters but a backslash takes the next one literally (and joins a
// line ending in one with the next); leading and trailing white space is
// dropped. '...' keeps everything up to the next single quote. "..." keeps
// everything, but a backslash before one of "\`$ stands for that character
// and one before a newline joins the lines; before anything else the
// backslash stays.
func systemdEnvFile(content string) map[string]string {
	env := map[string]string{}
	const (
		preKey = iota
		key
		preValue
		value
		valueEscape
		single
		double
		doubleEscape
		comment
	)
	state := preKey
	var k, v strings.Builder
	trim := -1 // where trailing white space of an unquoted value starts
	push := func() {
		s := v.String()
		if state == value && trim >= 0 {
			s = s[:trim]
		}
		env[strings.TrimRight(k.String(), " \t")] = s
		k.Reset()
		v.Reset()
		trim = -1
	}
	newline := func(c byte) bool { return c == '\n' || c == '\r' }
	space := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for i := 0; i < len(content); i++ {
		c := content[i]
		switch state {
		case preKey:
			if c == '#' || c == ';' {
				state = comment
			} else if !space(c) {
				state = key
				k.WriteByte(c)
			}
		case key:
			if newline(c) {
				state = preKey
				k.Reset()
			} else if c == '=' {
				state = preValue
			} else {
				k.WriteByte(c)
			}
		case preValue:
			switch {
			case newline(c):
				push()
				state = preKey
			case c == '\'':
				state = single
			case c == '"':
				state = double
			case c == '\\':
				state = valueEscape
			case !space(c):
				state = value
				v.WriteByte(c)
			}
		case value:
			switch {
			case newline(c):
				push()
				state = preKey
			case c == '\\':
				state = valueEscape
				trim = -1
			default:
				if !space(c) {
					trim = -1
				} else if trim < 0 {
					trim = v.Len()
				}
				v.WriteByte(c)
			}
		case valueEscape:
			state = value
			if !newline(c) {
				v.WriteByte(c)
			}
		case single:
			if c == '\'' {
				state = preValue
			} else {
				v.WriteByte(c)
			}
		case double:
			switch c {
			case '"':
				state = preValue
			case '\\':
				state = doubleEscape
			default:
				v.WriteByte(c)
			}
		case doubleEscape:
			state = double
			if strings.IndexByte("\"\\`$", c) >= 0 {
				v.WriteByte(c)
			} else if c != '\n' {
				v.WriteByte('\\')
				v.WriteByte(c)
			}
		case comment:
			if newline(c) {
				state = preKey
			}
		}
	}
	if state != preKey && state != key && state != comment {
		push()
	}
	return env
}

// systemdSplit splits a variable's value as an unbraced $NAME of
// ExecStart= does: at white space; '...' and "..." group and are removed;
// a backslash takes the next character literally, inside quotes too; an
// unterminated quote or a trailing backslash ends the last word.
func systemdSplit(value string) []string {
	var words []string
	var w strings.Builder
	in, quote, escaped := false, byte(0), false
	for i := 0; i < len(value); i++ {
		c := value[i]
		switch {
		case escaped:
			w.WriteByte(c)
			escaped = false
		case c == '\\':
			in, escaped = true, true
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			in, quote = true, c
		case strings.IndexByte(" \t\n\r", c) >= 0:
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			in = true
			w.WriteByte(c)
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// TestInstallScriptSystemdParsing checks the two readers above against
// the examples of systemd's manual pages and the cases install.sh relies on.
func TestInstallScriptSystemdParsing(t *testing.T) {
	env := systemdEnvFile("# comment\n; other\nA=plain  value  \nB=\"x \\\"y\\\" \\\\ \\$z \\n\"\nC='it \\ is'\nD=\\\"lead\nE=a\\\nb\n")
	want := map[string]string{"A": "plain  value", "B": `x "y" \ $z \n`, "C": `it \ is`, "D": `"lead`, "E": "ab"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q (all: %q)", k, env[k], v, env)
		}
	}
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"  a  b\tc ", []string{"a", "b", "c"}},
		{`'a b' "c d" e\ f`, []string{"a b", "c d", "e f"}},
		{`'it\'s' "\\x" '' x''y`, []string{"it's", `\x`, "", "xy"}},
	} {
		if got := systemdSplit(c.in); !slices.Equal(got, c.want) {
			t.Errorf("split %q: %q, want %q", c.in, got, c.want)
		}
	}
}
