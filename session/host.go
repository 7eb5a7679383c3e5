package session

import (
	"errors"
	"fmt"
	"strings"
)

// HostStatus is the daemon's host as far as sessions care: the data
// directory's free space against the floor.
type HostStatus struct {
	DataDir string `json:"data_dir"`
	Free    int64  `json:"free"`
	Floor   int64  `json:"floor"`
	// Below is true while Free < Floor: what needs space is refused.
	Below bool `json:"below"`
	// DiskFullPaused are the sessions paused because a disk write found
	// the host disk full.
	DiskFullPaused []string `json:"disk_full_paused,omitempty"`
	// OutputHeld are the sessions whose commands' output is held for
	// lack of room, whether or not free space is below the floor (the
	// store keeps its own reserve under it).
	OutputHeld []string `json:"output_held,omitempty"`
}

// Message says the condition in one line, or "" when there is none.
func (h HostStatus) Message() string {
	var msg string
	if h.Below || len(h.DiskFullPaused) > 0 {
		msg = fmt.Sprintf("host disk low: %s free under %s, below the %s floor (free_space_floor)", FormatBytes(h.Free), h.DataDir, FormatBytes(h.Floor))
	}
	if len(h.OutputHeld) > 0 {
		held := fmt.Sprintf("output held for lack of room on %s (%s free): %s", h.DataDir, FormatBytes(h.Free), strings.Join(h.OutputHeld, ", "))
		if msg != "" {
			msg += "; "
		}
		msg += held
	}
	return msg
}

// ErrNoSpace is the class of refusals for lack of space on the host.
var ErrNoSpace = errors.New("no space left on the host")
