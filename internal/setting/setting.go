// Package setting is the error a package's Config.Validate returns for a
// field it cannot use, so that a caller that read the field from
// somewhere else (cmd/llmproxy, from LLMPROXY_* variables) can name it
// the way its user wrote it.
package setting

// Error is a Config field a package cannot use: Field is its Go name,
// Problem what is wrong with its value, in words that never quote a
// value that may hold a secret.
type Error struct {
	Pkg, Field, Problem string
}

func (e *Error) Error() string { return e.Pkg + ": " + e.Field + ": " + e.Problem }

// Bad is the *Error for pkg's field.
func Bad(pkg, field, problem string) error {
	return &Error{Pkg: pkg, Field: field, Problem: problem}
}
