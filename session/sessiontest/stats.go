package sessiontest

import (
	"context"
	"fmt"

	"github.com/berthvm/berth/session"
)

// maxHistory bounds the samples the fake keeps per session.
const maxHistory = 1000

// History returns the samples AddSample gave the session within
// session.HistoryWindow of the fake's clock, oldest first.
func (f *Fake) History(ctx context.Context, name string) ([]session.Sample, error) {
	s, err := f.enterSession(ctx, "History", name)
	if err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	since := f.now().Add(-session.HistoryWindow)
	out := []session.Sample{}
	for _, x := range s.history {
		if x.Time.After(since) {
			out = append(out, x)
		}
	}
	return out, nil
}

// AddSample appends samples to a session's history, as the daemon's
// sampler would; a sample with no Time takes the fake's clock. The newest
// becomes the session's Live CPU and memory figures and is published as a
// stats event.
func (f *Fake) AddSample(name string, samples ...session.Sample) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	if len(samples) == 0 {
		return fmt.Errorf("add sample to %q: none given: %w", name, session.ErrInvalid)
	}
	for _, x := range samples {
		if x.Time.IsZero() {
			x.Time = f.now()
		}
		s.history = append(s.history, x)
	}
	if n := len(s.history); n > maxHistory {
		s.history = append(s.history[:0:0], s.history[n-maxHistory:]...)
	}
	last := samples[len(samples)-1]
	lv := session.Live{Time: f.now(), CPUPercent: float64(last.CPUPercent), GuestCPUPercent: float64(last.CPUPercent), RSSBytes: last.RSSBytes}
	if s.info.Live != nil {
		lv.CPUSeconds = s.info.Live.CPUSeconds
	}
	s.info.Live = &lv
	s.info.MemUsedBytes, s.info.DirtyBytes = last.MemUsedBytes, last.DirtyBytes
	f.publishLocked(context.Background(), s, session.Event{Kind: session.EventStats})
	return nil
}
