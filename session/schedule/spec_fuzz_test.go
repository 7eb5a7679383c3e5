package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// FuzzParseSpec parses arbitrary schedule specs, as they come from
// `berth schedule add` and the API. Property: a spec either fails with
// ErrInvalid, or is due again: from any time (2000 to 2090 here, in UTC
// and in a zone with daylight saving), its next time is strictly after
// that time, within five years for a cron expression (every field
// combination that can occur at all occurs within four), and the time
// after it is later still. A spec the scheduler accepts but that never
// comes due would make the schedule loop fire it on every pass.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"* * * * *", "*/5 * * * *", "0 3 * * 1-5", "30 2 29 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *",
		"@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight", "@reboot",
		"@every 1s", "@every 90m", "@every 0s", "@every 1.5s", "@every 2562047h", "@every", "@bogus",
		"0 0 1 1 *", "59 23 31 12 6", "0 0 * * 7", "0 0 ? * *", "5-3 * * * *", "*/0 * * * *",
		"0 0 1-31/2 * MON", "TZ=UTC 0 0 * * *", "CRON_TZ=Europe/Berlin 0 2 * * *", "0 0 29 2 1",
		"", "   ", "* * * *", "* * * * * *", "0 0 L * *", "0 0 1W * *",
	} {
		f.Add(s, int64(1_700_000_000))
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		berlin = time.FixedZone("CET", 3600)
	}
	f.Fuzz(func(t *testing.T, spec string, at int64) {
		sched, err := ParseSpec(spec)
		if err != nil {
			if !errors.Is(err, session.ErrInvalid) {
				t.Fatalf("ParseSpec(%q): %v, not ErrInvalid", spec, err)
			}
			return
		}
		const from, to = 946_684_800, 3_786_912_000 // 2000-01-01 to 2090-01-01
		span := int64(to - from)
		sec := from + (at%span+span)%span
		every := strings.HasPrefix(strings.TrimSpace(spec), "@every")
		for _, loc := range []*time.Location{time.UTC, berlin} {
			now := time.Unix(sec, 0).In(loc)
			next := sched.Next(now)
			if !next.After(now) {
				t.Fatalf("ParseSpec(%q) is next due at %v, not after %v", spec, next, now)
			}
			if !every && next.Sub(now) > 5*366*24*time.Hour {
				t.Fatalf("ParseSpec(%q) is next due at %v, over five years after %v", spec, next, now)
			}
			if after := sched.Next(next); !after.After(next) {
				t.Fatalf("ParseSpec(%q): due at %v, then at %v", spec, next, after)
			}
		}
	})
}
