package deploy

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documentation: README.md is the front door (what llmproxy is, the
// set-up commands, a quick start, configuration and a map of the docs);
// the rest is in docs/ and CONTRIBUTING.md. These tests keep the README
// short and its set-up commands in it, and every relative link of the
// documentation pointing at a file and heading that exist.

// readmeMaxLines is the most lines README.md may have.
const readmeMaxLines = 300

// setUpCommands are the README's two set-up commands, each on a line of
// its own: running the proxy, and running every test.
var setUpCommands = []string{
	"go run ./cmd/llmproxy",
	"npm ci --prefix e2e/testdata/node && go test -race ./...",
}

func TestReadmeIsShortAndHasTheSetUpCommands(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := len(strings.Split(strings.TrimSuffix(readme, "\n"), "\n")); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d allowed: move detail into docs/", n, readmeMaxLines)
	}
	_, setUp, ok := strings.Cut(readme, "\n## Set up\n")
	if !ok {
		t.Fatal("README.md: no ## Set up section")
	}
	setUp, _, _ = strings.Cut(setUp, "\n## ")
	for _, cmd := range setUpCommands {
		if !strings.Contains("\n"+setUp+"\n", "\n"+cmd+"\n") {
			t.Errorf("README.md's Set up section lacks the command %q on a line of its own", cmd)
		}
	}
}

// docFiles are the documentation files whose links are checked, relative
// to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "deploy/README.md"}
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	for _, d := range docs {
		rel, err := filepath.Rel("..", d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// mdLink is the target of an inline Markdown link or image: ](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestDocLinksResolve(t *testing.T) {
	headings := map[string]map[string]bool{} // repository path → slugs
	slugsOf := func(path string) (map[string]bool, error) {
		if s, ok := headings[path]; ok {
			return s, nil
		}
		b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(path)))
		if err != nil {
			return nil, err
		}
		s := headingSlugs(string(b))
		headings[path] = s
		return s, nil
	}
	checked := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range links(string(b)) {
			if err := checkLink(file, target, slugsOf); err != nil {
				t.Errorf("%s: link (%s): %v", file, target, err)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d links; has the documentation changed shape?", checked)
	}
}

// checkLink checks one link target of file (a repository path): a
// relative path must name a file or directory that exists, and an anchor
// a heading of that Markdown file (of file itself when there is no path).
// Links with a scheme (https:, mailto:) are not checked.
func checkLink(file, target string, slugsOf func(string) (map[string]bool, error)) error {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return nil
	}
	path, anchor, _ := strings.Cut(target, "#")
	path, err := url.PathUnescape(path)
	if err != nil {
		return err
	}
	resolved := file
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return fmt.Errorf("absolute path; use one relative to %s", file)
		}
		resolved = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
		if strings.HasPrefix(resolved, "../") {
			return fmt.Errorf("%s is outside the repository", resolved)
		}
		if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(resolved))); err != nil {
			return fmt.Errorf("no file %s", resolved)
		}
	}
	if anchor == "" {
		return nil
	}
	if !strings.HasSuffix(resolved, ".md") {
		return fmt.Errorf("anchor #%s on %s, which is not Markdown", anchor, resolved)
	}
	slugs, err := slugsOf(resolved)
	if err != nil {
		return err
	}
	if !slugs[anchor] {
		return fmt.Errorf("%s has no heading whose anchor is #%s", resolved, anchor)
	}
	return nil
}

// links returns the targets of the inline links and images of a Markdown
// text, outside fenced code blocks.
func links(md string) []string {
	var out []string
	for _, line := range proseLines(md) {
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// proseLines returns the lines of a Markdown text outside fenced code
// blocks.
func proseLines(md string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// headingSlugs returns the anchors GitHub gives the ATX headings of a
// Markdown text: a heading's text in lower case, without punctuation but
// '-' and '_' (so without backticks), spaces as '-'; a repeated anchor
// gets -1, -2, … in order.
func headingSlugs(md string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(md) {
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, "#")
		if text != "" && text[0] != ' ' {
			continue // "#tag", not a heading
		}
		s := slug(strings.TrimSpace(text))
		if n := seen[s]; n > 0 {
			slugs[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			slugs[s] = true
		}
		seen[s]++
	}
	return slugs
}

// slug is GitHub's anchor of a heading's text.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Many replicas, one limit":           "many-replicas-one-limit",
		"`llmproxy status`":                  "llmproxy-status",
		"Use it with…":                       "use-it-with",
		"Realtime (WebSocket)":               "realtime-websocket",
		"What it does, step by step":         "what-it-does-step-by-step",
		"LLMPROXY_ROUTE_<NAME>_RPM":          "llmproxy_route_name_rpm",
		"Amazon Bedrock and signed requests": "amazon-bedrock-and-signed-requests",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}
