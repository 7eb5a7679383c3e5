package common

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Bytes formats a byte count compactly for table cells: "0", "512B",
// "1.2K", "34M", "1.0G" (binary units).
func Bytes(n int64) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	const unit = 1024
	var s string
	if n < unit {
		s = strconv.FormatInt(n, 10) + "B"
	} else {
		v := float64(n)
		suffix := "KMGTPE"
		i := -1
		for v >= unit && i < len(suffix)-1 {
			v /= unit
			i++
		}
		if v < 10 {
			s = strconv.FormatFloat(v, 'f', 1, 64) + suffix[i:i+1]
		} else {
			s = strconv.FormatFloat(v, 'f', 0, 64) + suffix[i:i+1]
		}
	}
	if neg {
		return "-" + s
	}
	return s
}

// BytesLong formats a byte count for sentences: "12.3 MiB", "512 bytes".
func BytesLong(n int64) string {
	if n < 1024 && n > -1024 {
		if n == 1 {
			return "1 byte"
		}
		return strconv.FormatInt(n, 10) + " bytes"
	}
	s := Bytes(n)
	return s[:len(s)-1] + " " + s[len(s)-1:] + "iB"
}

// Duration formats a duration with at most two units: "45s", "3m12s",
// "4h05m", "2d3h". Sub-second durations show milliseconds.
func Duration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// Ago formats how long ago t was, relative to now: "12s ago", "3m ago".
// The zero time is "—".
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	switch {
	case d < 2*time.Second:
		return "now"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h ago"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d ago"
}

// MiB formats a size given in MiB: "512M", "2.0G".
func MiB(n int) string { return Bytes(int64(n) << 20) }

// ParseSize parses "512M", "10G", "1.5GiB", "2048" (bytes unless a default
// unit is given) into bytes.
func ParseSize(s string, defUnit int64) (int64, error) {
	s = strings.TrimSpace(strings.ToUpper(s))
	if s == "" {
		return 0, nil
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "IB"), "B")
	mult := defUnit
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			mult, s = 1<<10, s[:n-1]
		case 'M':
			mult, s = 1<<20, s[:n-1]
		case 'G':
			mult, s = 1<<30, s[:n-1]
		case 'T':
			mult, s = 1<<40, s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("%q is not a size (try 512M or 10G)", s)
	}
	return int64(f * float64(mult)), nil
}

// ErrorText renders an error for the status line: one line, bounded, and
// prefixed with a plain-words hint for the error classes an operator can
// act on. The full error goes to the log, not the screen.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	msg := SanitizeLine(err.Error())
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	switch {
	case errors.Is(err, session.ErrPermission):
		return "not allowed: " + msg
	case errors.Is(err, session.ErrUnavailable):
		return "unavailable: " + msg
	}
	return msg
}

// ExecLabel is a short human label for an execution: its command line,
// or "shell" for an outside process without argv.
func ExecLabel(e session.Execution) string {
	if len(e.Argv) == 0 {
		if e.Outside {
			return "(outside process)"
		}
		return "(no command)"
	}
	// sh -c 'cmd' is how the TUI runs commands; show the command itself.
	if len(e.Argv) == 3 && (e.Argv[0] == "/bin/sh" || e.Argv[0] == "sh") && e.Argv[1] == "-c" {
		return SanitizeLine(e.Argv[2])
	}
	return SanitizeLine(strings.Join(e.Argv, " "))
}

// ShortID shortens an execution id for tables.
func ShortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
