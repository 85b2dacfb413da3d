package main

import (
	"reflect"
	"strings"
	"testing"
)

// TestConfigurationDocNamesEveryVariable: docs/configuration.md, the one
// complete list of settings, names every variable -h lists, the per-route
// ones included, so that a new setting cannot be documented only in -h.
func TestConfigurationDocNamesEveryVariable(t *testing.T) {
	doc, err := readFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	typ := reflect.TypeOf(config{})
	for i := 0; i < typ.NumField(); i++ {
		if name := typ.Field(i).Tag.Get("env"); name != "" {
			names = append(names, envPrefix+name)
		}
	}
	for _, s := range routeSettings {
		names = append(names, routePrefix+"<NAME>_"+s.name)
	}
	if len(names) < 40 {
		t.Fatalf("only %d variables found; has the config changed shape?", len(names))
	}
	for _, name := range names {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("docs/configuration.md does not name %s", name)
		}
	}
}
