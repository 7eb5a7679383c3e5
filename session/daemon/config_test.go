package daemon

import (
	"strings"
	"testing"
)

// run_record_limit: unset or 0 leaves the agent's bound; 1 to 100,000 is
// taken; anything else is refused, naming the key.
func TestConfigRunRecordLimit(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
		err  string
	}{
		{text: "", want: 0},
		{text: "run_record_limit = 0", want: 0},
		{text: "run_record_limit = 200", want: 200},
		{text: "run_record_limit = 100000", want: 100000},
		{text: "run_record_limit = 100001", err: "run_record_limit = 100001"},
		{text: "run_record_limit = -1", err: "run_record_limit = -1"},
	} {
		t.Run(c.text, func(t *testing.T) {
			cfg, err := ParseConfig("config.toml", []byte(c.text))
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
