package daemon_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/berthvm/berth/assets"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/session/engine"
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

// run_record_limit: unset or 0 is the agent's bound; 1 to that bound is
// taken; anything else is refused, naming the key.
func TestConfigRunRecordLimit(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
		err  string
	}{
		{text: "", want: engine.DefaultRunRecordLimit},
		{text: "run_record_limit = 0", want: engine.DefaultRunRecordLimit},
		{text: "run_record_limit = 200", want: 200},
		{text: "run_record_limit = 100000", want: 100000},
		{text: "run_record_limit = 100001", err: "run_record_limit = 100001"},
		{text: "run_record_limit = -1", err: "run_record_limit = -1"},
	} {
		t.Run(c.text, func(t *testing.T) {
			cfg, err := daemon.ParseConfig("config.toml", []byte(c.text))
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("error %v, want one naming %q", err, c.err)
			case c.err == "" && err != nil:
				t.Errorf("error %v", err)
			case c.err == "" && cfg.RunRecordLimit != c.want:
				t.Errorf("RunRecordLimit %d, want %d", cfg.RunRecordLimit, c.want)
			}
		})
	}
}
