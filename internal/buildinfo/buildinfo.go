// Package buildinfo says which build of llmproxy is running: the module
// version, the commit it was built from and that commit's time, and the Go
// release that compiled it. `llmproxy version`, the admin /healthz answer,
// the start-up log line, `llmproxy -h` and the llmproxy_build_info metric
// all show what Read returns.
//
// Go stamps the commit into a binary only when `go build` runs in a git
// work tree with stamping on. It is off here (GOFLAGS=-buildvcs=false: with
// stamping on, `go build` fails outright in a checkout that git calls of
// "dubious ownership", one owned by another user), and a build without
// .git, such as the Dockerfile's, cannot have it. So scripts/build-static.sh
// also hands the commit to the linker (-X), and Read takes what Go stamped
// first and the linker's values for what is missing. A binary from
// `go install …@<commit>` has neither, but its version is a pseudo-version
// that ends in the commit's first 12 hex digits and starts with its time.
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
)

// Set by the linker (scripts/build-static.sh passes -X for each); empty
// when the build did not.
var (
	version      string
	revision     string
	revisionTime string
	modified     string // "true" when the work tree had changes
)

// Info is one build's identity. Empty strings are what nobody recorded.
type Info struct {
	Version   string `json:"version,omitempty"`   // module version; "(devel)" when not recorded
	Revision  string `json:"revision,omitempty"`  // commit hash: 40 hex digits, or 12 from a pseudo-version
	Time      string `json:"time,omitempty"`      // the commit's time, RFC 3339 in UTC
	Modified  bool   `json:"modified,omitempty"`  // built from a work tree with uncommitted changes
	GoVersion string `json:"goversion,omitempty"` // the Go release that compiled it, as runtime.Version
}

// linked is what the linker set (scripts/build-static.sh's -X flags).
type linked struct {
	Version, Revision, Time string
	Modified                bool
}

// Read is this binary's Info.
var Read = sync.OnceValue(read)

func read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuild(bi, linked{Version: version, Revision: revision, Time: revisionTime, Modified: modified == "true"})
}

// pseudoVersion matches the end of a Go pseudo-version
// (vX.Y.Z-[pre.]yyyymmddhhmmss-abcdef123456), capturing the time and the
// commit prefix.
var pseudoVersion = regexp.MustCompile(`(?:^|[-.])(\d{14})-([0-9a-f]{12})(?:\+.*)?$`)

// fromBuild merges what Go recorded in bi (nil when it recorded nothing)
// with what the linker set: Go's own stamp wins, the linker fills what it
// lacks, and a pseudo-version names the commit when neither does.
func fromBuild(bi *debug.BuildInfo, l linked) Info {
	info := Info{GoVersion: runtime.Version()}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = l.Version
	}
	if info.Revision == "" && l.Revision != "" {
		info.Revision, info.Time, info.Modified = l.Revision, l.Time, l.Modified
	}
	if m := pseudoVersion.FindStringSubmatch(info.Version); m != nil && info.Revision == "" {
		info.Revision = m[2]
		if t, err := time.Parse("20060102150405", m[1]); err == nil {
			info.Time = t.Format(time.RFC3339)
		}
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	return info
}

// Short is the one-line form, for `llmproxy -h`:
// "v1.2.3 (commit 0123456789ab, go1.26.8)".
func (i Info) Short() string {
	rev := "commit unknown"
	if i.Revision != "" {
		rev = "commit " + i.Revision[:min(12, len(i.Revision))]
		if i.Modified {
			rev += " with local changes"
		}
	}
	return fmt.Sprintf("%s (%s, %s)", i.Version, rev, i.GoVersion)
}

// Describe is `llmproxy version`: one "name value" line for each part.
func (i Info) Describe() string {
	rev := i.Revision
	switch {
	case rev == "":
		rev = "unknown (built without git and without scripts/build-static.sh)"
	case i.Modified:
		rev += " (with uncommitted changes)"
	}
	t := i.Time
	if t == "" {
		t = "unknown"
	}
	return fmt.Sprintf("llmproxy %s\nrevision  %s\ntime      %s\ngo        %s %s/%s\n",
		i.Version, rev, t, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}
