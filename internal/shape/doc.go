// Package shape holds the tests that keep the project's shape: budgets a
// change must stay within, checked on every CI run. It has no code of
// its own; raising a budget is a one-line change to a table a reviewer
// sees.
package shape
