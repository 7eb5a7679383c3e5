package session

import "time"

// ReplaceOptions configure Replace.
type ReplaceOptions struct {
	// Image is the image of the new VM; "" keeps the session's image (its
	// current build).
	Image string `json:"image,omitempty"`
}

// ReplaceResult reports a replacement.
type ReplaceResult struct {
	Session Session `json:"session"`
	// Dropped is what the old system disk held: the changes made to the
	// VM's own system (packages, /etc, /root), gone now.
	Dropped int64  `json:"dropped"`
	From    string `json:"from"` // image@digest before
	To      string `json:"to"`   // image@digest after
}

// CopyResult reports a tree copy.
type CopyResult struct {
	Files    int           `json:"files"`
	Dirs     int           `json:"dirs"`
	Symlinks int           `json:"symlinks"`
	Bytes    int64         `json:"bytes"`
	Took     time.Duration `json:"took"`
}
