package upstream

import (
	"errors"
	"fmt"
	"strings"
)

// Hunk is one hunk of a unified diff in a _diff.md of the offer: the
// lines it finds (context and removed, in order) and the lines it puts in
// their place (context and added).
type Hunk struct {
	Header   string
	Old, New []string
}

// ParseHunks reads the hunks of the ```diff blocks of md. A block may hold
// several hunks, each opened by an "@@" line; a line of a hunk starts with
// " " (context), "-" (removed) or "+" (added).
func ParseHunks(md string) ([]Hunk, error) {
	var out []Hunk
	in := false
	for n, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "```diff"):
			in = true
		case in && strings.HasPrefix(line, "```"):
			in = false
		case !in:
		case strings.HasPrefix(line, "@@"):
			out = append(out, Hunk{Header: line})
		case len(out) == 0:
			return nil, fmt.Errorf("line %d: a diff line before any @@ header: %q", n+1, line)
		default:
			h := &out[len(out)-1]
			switch {
			case strings.HasPrefix(line, " "):
				h.Old = append(h.Old, line[1:])
				h.New = append(h.New, line[1:])
			case strings.HasPrefix(line, "-"):
				h.Old = append(h.Old, line[1:])
			case strings.HasPrefix(line, "+"):
				h.New = append(h.New, line[1:])
			case line == "":
			default:
				return nil, fmt.Errorf("line %d: not a diff line: %q", n+1, line)
			}
		}
	}
	if in {
		return nil, errors.New("a ```diff block is not closed")
	}
	if len(out) == 0 {
		return nil, errors.New("no hunk")
	}
	return out, nil
}

// ApplyHunks applies hunks to the function body of text (the region
// between the first and the last "$body$"): each hunk's lines to find must
// stand, once, on consecutive lines of that region (compared with their
// surrounding blanks trimmed), and are replaced by its new lines.
func ApplyHunks(text string, hunks []Hunk) (string, error) {
	lines := strings.Split(text, "\n")
	first, last := -1, -1
	for i, l := range lines {
		if strings.Contains(l, "$body$") {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 || first == last {
		return "", errors.New("no $body$ ... $body$ region")
	}
	for _, h := range hunks {
		if len(h.Old) == 0 {
			return "", fmt.Errorf("hunk %q finds nothing to anchor it", h.Header)
		}
		at := -1
		for i := first; i+len(h.Old) <= last; i++ {
			if sameTrimmed(lines[i:i+len(h.Old)], h.Old) {
				if at >= 0 {
					return "", fmt.Errorf("hunk %q matches at lines %d and %d", h.Header, at+1, i+1)
				}
				at = i
			}
		}
		if at < 0 {
			return "", fmt.Errorf("hunk %q does not match the function's body", h.Header)
		}
		rest := append(append([]string{}, h.New...), lines[at+len(h.Old):]...)
		lines = append(lines[:at], rest...)
		last += len(h.New) - len(h.Old)
	}
	return strings.Join(lines, "\n"), nil
}

func sameTrimmed(a, b []string) bool {
	for i := range a {
		if strings.TrimSpace(a[i]) != strings.TrimSpace(b[i]) {
			return false
		}
	}
	return true
}
