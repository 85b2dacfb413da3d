package headerparse

import "strings"

// maxSFMembers bounds how many list members are read from one field; real
// servers send one to three.
const maxSFMembers = 32

// sfMember is one member of a Structured Fields list (RFC 9651), read
// leniently: enough for the IETF RateLimit fields, not a validator.
type sfMember struct {
	item   string // the bare item; a string's quotes and escapes removed
	params []sfParam
}

type sfParam struct{ key, value string }

// param returns the value of the parameter key, matched case-insensitively.
func (m sfMember) param(key string) string {
	for _, p := range m.params {
		if p.key == key {
			return p.value
		}
	}
	return ""
}

// parseSFList splits a list such as `"burst";q=100;w=60, "daily";q=1000`
// into members, skipping empty ones. A parameter without a value gets "?1",
// SF's boolean true.
func parseSFList(v string) []sfMember {
	if v == "" {
		return nil // most answers have no such field: no work, no allocation
	}
	var out []sfMember
	for _, raw := range splitOutsideQuotes(v, ',') {
		if len(out) == maxSFMembers {
			break
		}
		if strings.TrimSpace(raw) == "" {
			continue
		}
		parts := splitOutsideQuotes(raw, ';')
		m := sfMember{item: unquote(strings.TrimSpace(parts[0]))}
		for _, p := range parts[1:] {
			key, value, found := strings.Cut(p, "=")
			if !found {
				value = "?1"
			}
			m.params = append(m.params, sfParam{
				key:   strings.ToLower(strings.TrimSpace(key)),
				value: unquote(strings.TrimSpace(value)),
			})
		}
		out = append(out, m)
	}
	return out
}

// splitOutsideQuotes splits s at every sep that is not inside a quoted
// string. It always returns at least one element.
func splitOutsideQuotes(s string, sep byte) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unquote removes the quotes and backslash escapes of an SF string, and
// returns anything else unchanged.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
