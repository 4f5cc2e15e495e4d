package kubeinterface

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every error that reports bad input: a malformed
// request, annotation or payload. Check with errors.Is.
var ErrInvalid = errors.New("invalid kubegpu input")

// FieldError is one problem with one field of a pod or node: an annotation,
// a container's resource limit, or a payload field.
type FieldError struct {
	// Container is the container whose limits are at fault; empty for
	// pod- and node-level fields.
	Container string
	// Field is the annotation key, resource name or payload path.
	Field string
	// Value is the offending value as the user wrote it; Error shows it
	// with Quote.
	Value string
	// Want says what a valid value looks like, e.g. "an integer 1..100".
	Want string
}

// Error reads like `container "train": kubegpu.io/gpu-cores must be an
// integer 1..100, got "150"`.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Container != "" {
		fmt.Fprintf(&b, "container %q: ", e.Container)
	}
	fmt.Fprintf(&b, "%s must be %s, got %s", e.Field, e.Want, Quote(e.Value))
	return b.String()
}

// MaxQuotedChars is the most characters of a value that an error message
// quotes.
const MaxQuotedChars = 64

// Quote is how error messages show a value that a user or a node wrote: in
// double quotes, cut after MaxQuotedChars characters (then followed by its
// length), if what is shown is printable ASCII; otherwise only its length.
// So no message, condition or log line carries a terminal control sequence
// or a whole 250 KiB annotation, and the cost of quoting is bounded. The
// shipped admission policy builds the same text in CEL (deploy/admission),
// so that kubectl and the scheduler say the same words.
func Quote(v string) string {
	n := utf8.RuneCountInString(v)
	shown := v
	if n > MaxQuotedChars {
		runes := 0
		for i := range v {
			if runes == MaxQuotedChars {
				shown = v[:i]
				break
			}
			runes++
		}
	}
	switch {
	case !PrintableASCII(shown):
		return fmt.Sprintf("(%d characters, not all printable ASCII)", n)
	case n > MaxQuotedChars:
		return fmt.Sprintf("\"%s\"... (%d characters)", shown, n)
	}
	return `"` + v + `"`
}

// PrintableASCII reports whether every byte of s is a printable ASCII
// character, space included.
func PrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// InvalidError collects every FieldError found in one object, so that a user
// fixes them all at once.
type InvalidError struct {
	// Object names the pod or node, e.g. "pod default/train".
	Object string
	Fields []*FieldError
}

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Error()
	}
	return fmt.Sprintf("%s: %s", e.Object, strings.Join(parts, "; "))
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Unwrap exposes the field errors to errors.As.
func (e *InvalidError) Unwrap() []error {
	out := make([]error, len(e.Fields))
	for i, f := range e.Fields {
		out[i] = f
	}
	return out
}

// collector gathers field errors for one object.
type collector struct {
	object string
	fields []*FieldError
}

func (c *collector) add(container, field, value, want string) {
	c.fields = append(c.fields, &FieldError{Container: container, Field: field, Value: value, Want: want})
}

func (c *collector) err() error {
	if len(c.fields) == 0 {
		return nil
	}
	return &InvalidError{Object: c.object, Fields: c.fields}
}
