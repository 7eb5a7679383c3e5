package session

import (
	"fmt"
	"strconv"
	"time"
)

// How sizes and durations read, in every front end. Units are binary; one
// decimal is shown below 10 of a unit, none from 10 up, in both byte forms.

// scaleBytes returns the index in "KMGTPE" of the largest binary unit that
// keeps |n| at or above 1 of it (-1 for bytes), and |n| in that unit,
// rounded as both byte forms print it.
func scaleBytes(n int64) (unit int, text string) {
	if n < 0 {
		n = -n
	}
	v, unit := float64(n), -1
	for v >= 1024 && unit < len("KMGTPE")-1 {
		v /= 1024
		unit++
	}
	switch {
	case unit < 0:
		text = strconv.FormatInt(n, 10)
	case v < 10:
		text = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		text = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return unit, text
}

// FormatBytes formats a byte count for sentences and CLI output: "0 B",
// "812 B", "1.5 KiB", "12 MiB", "512 MiB", "4.0 GiB".
func FormatBytes(n int64) string {
	unit, text := scaleBytes(n)
	if n < 0 {
		text = "-" + text
	}
	if unit < 0 {
		return text + " B"
	}
	return text + " " + "KMGTPE"[unit:unit+1] + "iB"
}

// FormatBytesShort is FormatBytes for narrow table cells: "0", "512B",
// "1.5K", "12M", "2.0G".
func FormatBytesShort(n int64) string {
	if n == 0 {
		return "0"
	}
	unit, text := scaleBytes(n)
	if n < 0 {
		text = "-" + text
	}
	if unit < 0 {
		return text + "B"
	}
	return text + "KMGTPE"[unit:unit+1]
}

// FormatDuration formats a duration with at most two units: "350ms",
// "2.5s", "45s", "3m04s", "26h00m", "2d3h". Days start at 48 hours, so a
// day and a bit still reads in hours. Negative durations (clock skew) are
// shown as zero.
func FormatDuration(d time.Duration) string {
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

// FormatAgo formats how long ago something happened, coarsely: "now"
// (under 2s), "42s ago", "5m ago", "30h ago", "3d ago". Days start at 48
// hours, as in FormatDuration. A front end shows its own placeholder for a
// time that never was.
func FormatAgo(d time.Duration) string {
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
