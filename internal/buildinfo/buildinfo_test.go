package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

const commit = "d795ecd518a7703f2521dc5d6d50489125b0c02e"

func stamped(version string, settings ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/llmproxy/llmproxy", Version: version}}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

func TestFromBuild(t *testing.T) {
	release := linked{Version: "v1.2.0", Revision: commit, Time: "2026-11-24T09:20:09Z"}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		l    linked
		want Info
	}{
		{"nothing recorded", nil, linked{}, Info{Version: "(devel)", GoVersion: runtime.Version()}},
		{"go build with stamping off", stamped("(devel)"), linked{},
			Info{Version: "(devel)", GoVersion: "go1.26.8"}},
		{"go build in a work tree", stamped("v0.0.0-20261124092009-d795ecd518a7+dirty",
			"vcs", "git", "vcs.revision", commit, "vcs.time", "2026-11-24T09:20:09Z", "vcs.modified", "true"), linked{},
			Info{Version: "v0.0.0-20261124092009-d795ecd518a7+dirty", Revision: commit, Time: "2026-11-24T09:20:09Z", Modified: true, GoVersion: "go1.26.8"}},
		{"build-static.sh with stamping off", stamped("(devel)"), release,
			Info{Version: "v1.2.0", Revision: commit, Time: "2026-11-24T09:20:09Z", GoVersion: "go1.26.8"}},
		{"the linker's uncommitted changes", stamped("(devel)"), linked{Revision: commit, Modified: true},
			Info{Version: "(devel)", Revision: commit, Modified: true, GoVersion: "go1.26.8"}},
		{"Go's stamp wins over the linker's", stamped("v1.2.0", "vcs.revision", "0123456789abcdef0123456789abcdef01234567", "vcs.time", "2026-01-01T00:00:00Z"), release,
			Info{Version: "v1.2.0", Revision: "0123456789abcdef0123456789abcdef01234567", Time: "2026-01-01T00:00:00Z", GoVersion: "go1.26.8"}},
		{"go install at a commit", stamped("v0.0.0-20261124092009-d795ecd518a7"), linked{},
			Info{Version: "v0.0.0-20261124092009-d795ecd518a7", Revision: "d795ecd518a7", Time: "2026-11-24T09:20:09Z", GoVersion: "go1.26.8"}},
		{"go install after a tag", stamped("v1.2.1-0.20261124092009-d795ecd518a7"), linked{},
			Info{Version: "v1.2.1-0.20261124092009-d795ecd518a7", Revision: "d795ecd518a7", Time: "2026-11-24T09:20:09Z", GoVersion: "go1.26.8"}},
		{"go install at a tag", stamped("v1.2.0"), linked{},
			Info{Version: "v1.2.0", GoVersion: "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuild(tc.bi, tc.l); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDescribeNamesEveryPart(t *testing.T) {
	i := Info{Version: "v1.2.0", Revision: commit, Time: "2026-11-24T09:20:09Z", Modified: true, GoVersion: "go1.26.8"}
	got := i.Describe()
	for _, want := range []string{"llmproxy v1.2.0\n", "revision  " + commit + " (with uncommitted changes)\n",
		"time      2026-11-24T09:20:09Z\n", "go        go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("Describe lacks %q:\n%s", want, got)
		}
	}
	if got := (Info{Version: "(devel)", GoVersion: "go1.26.8"}).Describe(); !strings.Contains(got, "revision  unknown") || !strings.Contains(got, "time      unknown") {
		t.Errorf("an unrecorded commit must say so:\n%s", got)
	}
}

func TestShort(t *testing.T) {
	for _, tc := range []struct {
		info Info
		want string
	}{
		{Info{Version: "v1.2.0", Revision: commit, GoVersion: "go1.26.8"}, "v1.2.0 (commit d795ecd518a7, go1.26.8)"},
		{Info{Version: "(devel)", Revision: commit, Modified: true, GoVersion: "go1.26.8"}, "(devel) (commit d795ecd518a7 with local changes, go1.26.8)"},
		{Info{Version: "(devel)", GoVersion: "go1.26.8"}, "(devel) (commit unknown, go1.26.8)"},
	} {
		if got := tc.info.Short(); got != tc.want {
			t.Errorf("Short() = %q, want %q", got, tc.want)
		}
	}
}

// TestReadUsesTheLinkersValues holds Read to the variables
// scripts/build-static.sh sets: a test binary has no VCS stamp, so what the
// linker set must show.
func TestReadUsesTheLinkersValues(t *testing.T) {
	if version != "" || revision != "" {
		t.Skip("built with -X values already")
	}
	version, revision, revisionTime, modified = "v9.9.9", commit, "2026-11-24T09:20:09Z", "true"
	defer func() { version, revision, revisionTime, modified = "", "", "", "" }()
	got := read()
	if got.Revision != commit || got.Version != "v9.9.9" || !got.Modified || got.GoVersion != runtime.Version() {
		t.Errorf("got %+v", got)
	}
}
