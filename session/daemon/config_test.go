package daemon_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/berthvm/berth/assets"
	"github.com/berthvm/berth/session/daemon"
)

// TestDefaultConfigDocumentsDefaults: assets/config.toml, written into a
// new data directory, names every key the daemon reads, and its values
// are the defaults: it parses to what a file naming no key gives.
func TestDefaultConfigDocumentsDefaults(t *testing.T) {
	doc, err := daemon.ParseConfig("assets/config.toml", []byte(assets.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	none, err := daemon.ParseConfig("an empty config.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	none.Defaults = none.Defaults.WithFallbacks()
	if !reflect.DeepEqual(doc, none) {
		t.Errorf("config.toml documents\n%+v\nbut the defaults are\n%+v", doc, none)
	}
	var keys map[string]any
	if _, err := toml.Decode(assets.DefaultConfig(), &keys); err != nil {
		t.Fatal(err)
	}
	ft := reflect.TypeFor[daemon.File]()
	for i := range ft.NumField() {
		key, _, _ := strings.Cut(ft.Field(i).Tag.Get("toml"), ",")
		if _, ok := keys[key]; !ok {
			t.Errorf("config.toml does not document %s", key)
		}
	}
}
