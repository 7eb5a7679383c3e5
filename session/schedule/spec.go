// Package schedule reads schedules' timetables (cron expressions,
// descriptors and @every) and paces the loop that fires them. The contract
// (package session) checks the rest of a schedule request; Validate does
// both, for the engine and the fake alike.
package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/berthvm/berth/session"
)

// Spec is a parsed timetable.
type Spec = cron.Schedule

// MinEvery is the shortest interval "@every" accepts.
const MinEvery = time.Second

var cronFields = []string{"minute", "hour", "day-of-month", "month", "day-of-week"}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseSpec parses a schedule's timetable: a five-field cron expression, a
// descriptor (@yearly, @monthly, @weekly, @daily, @hourly) or "@every D"
// with D at least one second. Errors name the field at fault.
func ParseSpec(spec string) (Spec, error) {
	spec = strings.TrimSpace(spec)
	if rest, ok := strings.CutPrefix(spec, "@every"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("schedule %q: @every wants a duration such as 30s or 5m: %w", spec, session.ErrInvalid)
		}
		if d < MinEvery {
			return nil, fmt.Errorf("schedule %q: @every %s is below the minimum of %s: %w", spec, d, MinEvery, session.ErrInvalid)
		}
		if d%time.Second != 0 {
			return nil, fmt.Errorf("schedule %q: @every %s: use whole seconds: %w", spec, d, session.ErrInvalid)
		}
		return cron.Every(d), nil
	}
	if strings.HasPrefix(spec, "@") {
		s, err := cronParser.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("schedule %q: unknown descriptor (use @hourly, @daily, @weekly, @monthly, @yearly or @every D): %w", spec, session.ErrInvalid)
		}
		return s, nil
	}
	fields := strings.Fields(spec)
	if len(fields) != len(cronFields) {
		return nil, fmt.Errorf("schedule %q: want 5 fields (minute hour day-of-month month day-of-week) or @every D, got %d: %w", spec, len(fields), session.ErrInvalid)
	}
	// Parse each field alone in an otherwise all-stars expression, so the
	// error names the field at fault.
	for i, f := range fields {
		probe := []string{"*", "*", "*", "*", "*"}
		probe[i] = f
		if _, err := cronParser.Parse(strings.Join(probe, " ")); err != nil {
			return nil, fmt.Errorf("schedule %q: %s field %q: %v: %w", spec, cronFields[i], f, err, session.ErrInvalid)
		}
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %v: %w", spec, err, session.ErrInvalid)
	}
	// The parser looks five years ahead and answers the zero time when no
	// date matches (30 February): such a spec would never come due.
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("schedule %q never comes due: no date in the next five years matches its fields (check the day of month against the month): %w", spec, session.ErrInvalid)
	}
	return s, nil
}

// Validate checks a schedule request whole: the contract's checks and its
// timetable.
func Validate(req *session.ScheduleRequest) error {
	if err := session.ValidateSchedule(req); err != nil {
		return err
	}
	_, err := ParseSpec(req.Spec)
	return err
}

// MinWait is the shortest pause of the schedule loop: whatever a
// timetable says, the loop never fires twice within it. (Every schedule is
// at least MinEvery apart; a queued run starts early through a poke.)
const MinWait = 250 * time.Millisecond

// Wait is how long the schedule loop sleeps at now when the next schedule
// is due at next: at least MinWait, at most a minute.
func Wait(now, next time.Time) time.Duration {
	return min(max(next.Sub(now), MinWait), time.Minute)
}
