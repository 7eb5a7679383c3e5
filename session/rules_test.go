package session

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The rules front ends share: each is table-tested here, where it is
// defined.

func TestTransitionMessages(t *testing.T) {
	for _, c := range []struct {
		action Action
		state  State
		want   string
	}{
		{ActionPause, StateStopped, `cannot pause session "a": it is stopped (start it first): invalid state`},
		{ActionFlush, StatePaused, `cannot flush session "a": it is paused (resume it first): invalid state`},
		{ActionExec, StateStopped, `cannot exec in session "a": it is stopped (start it first): invalid state`},
		{ActionFiles, StateCrashed, `cannot use files of session "a": it is crashed (start it to boot a new VM on its workspace): invalid state`},
		{ActionStop, StateStopping, `cannot stop session "a": it is stopping (wait for it to stop): invalid state`},
		// In the state the action leads to: nothing to do, said once.
		{ActionStart, StateRunning, `cannot start session "a": it is already running: invalid state`},
		{ActionResume, StateRunning, `cannot resume session "a": it is already running: invalid state`},
		{ActionStop, StateStopped, `cannot stop session "a": it is already stopped: invalid state`},
		{ActionPause, StatePaused, `cannot pause session "a": it is already paused: invalid state`},
		{ActionSleep, StateSleeping, `cannot sleep session "a": it is already sleeping: invalid state`},
		{ActionPause, StateSleeping, `cannot pause session "a": it is sleeping: invalid state`},
		{ActionResume, StateStopped, `cannot resume session "a": it is stopped (start it first): invalid state`},
		{ActionFlush, StateSleeping, ``},
		{ActionResume, StateSleeping, ``},
	} {
		err := CheckTransition("a", c.action, c.state)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("CheckTransition(%s, %s) = %q, want %q", c.action, c.state, got, c.want)
		}
	}
}

func TestCheckCPUs(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{
		{1, ""},
		{64, ""},
		{0, `cpus 0: use 1 to 64`},
		{-1, `cpus -1: use 1 to 64`},
		{65, `cpus 65: use 1 to 64`},
	} {
		err := CheckCPUs(c.n)
		got := ""
		if err != nil {
			got = err.Error()
			if !errors.Is(err, ErrInvalid) || FieldOf(err) != FieldCPUs {
				t.Errorf("CheckCPUs(%d) = %v, not ErrInvalid of field cpus", c.n, err)
			}
		}
		if got != c.want {
			t.Errorf("CheckCPUs(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestValidateNameError(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"a", true}, {"0-a", true}, {strings.Repeat("x", 63), true},
		{"", false}, {"Demo", false}, {"_demo", false}, {"de_mo", false}, {"de.mo", false},
		{"de mo", false}, {"démo", false}, {"a/b", false}, {"-a", false}, {strings.Repeat("x", 64), false},
	} {
		err := ValidateName(c.name)
		if (err == nil) != c.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if c.ok {
			continue
		}
		var ne *NameError
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &ne) || ne.Name != c.name {
			t.Errorf("ValidateName(%q) = %#v: want a *NameError wrapping ErrInvalid", c.name, err)
		}
		if want := `invalid session name "` + c.name + `": use 1-63 lowercase letters, digits and dashes, starting with a letter or digit`; err.Error() != want {
			t.Errorf("ValidateName(%q) message %q", c.name, err)
		}
	}
}

func TestParseSizeErrors(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{"", "want a number with an optional K, M, G or T suffix"},
		{"12Q", "want a number with an optional K, M, G or T suffix"},
		{"-4G", "want a number with an optional K, M, G or T suffix"},
		{"0", "want a size above zero"},
		{"1.5", "1.5 is not a whole number of bytes"},
		{"9999999T", "too large"},
	} {
		if _, err := ParseSize(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSize(%q) = %v, want %q", c.in, err, c.want)
		}
	}
}

func TestParseMemory(t *testing.T) {
	for _, c := range []struct {
		in   string
		mib  int
		fail string
	}{
		{in: "512M", mib: 512},
		{in: "2g", mib: 2048},
		{in: "1.5G", mib: 1536},
		{in: "131072K", mib: 128},
		{in: "536870912", mib: 512}, // bytes, a whole number of MiB
		{in: "512", fail: "512 means 512 bytes; want a whole number of MiB (did you mean 512M?)"},
		{in: " 64 ", fail: "64 means 64 bytes; want a whole number of MiB (did you mean 64M?)"},
		{in: "1000K", fail: "1000K is 1024000 bytes; want a whole number of MiB, like 512M"},
		{in: "0", fail: "want a size above zero"},
		{in: "lots", fail: "want a number with an optional K, M, G or T suffix"},
	} {
		mib, err := ParseMemory(c.in)
		switch {
		case c.fail == "" && (err != nil || mib != c.mib):
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", c.in, mib, err, c.mib)
		case c.fail != "" && (err == nil || !strings.Contains(err.Error(), c.fail)):
			t.Errorf("ParseMemory(%q) = %d, %v; want an error with %q", c.in, mib, err, c.fail)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, c := range []struct {
		n           int64
		long, short string
	}{
		{0, "0 B", "0"},
		{1, "1 B", "1B"},
		{512, "512 B", "512B"},
		{1023, "1023 B", "1023B"},
		{1024, "1.0 KiB", "1.0K"},
		{1536, "1.5 KiB", "1.5K"},
		{3 << 20, "3.0 MiB", "3.0M"},
		{12 << 20, "12 MiB", "12M"},
		{12<<20 + 300<<10, "12 MiB", "12M"},
		{512 << 20, "512 MiB", "512M"},
		{4 << 30, "4.0 GiB", "4.0G"},
		{10 << 30, "10 GiB", "10G"},
		{16 << 30, "16 GiB", "16G"},
		{1<<40 + 1<<39, "1.5 TiB", "1.5T"},
		{-2048, "-2.0 KiB", "-2.0K"},
		{1 << 62, "4.0 EiB", "4.0E"},
	} {
		if got := FormatBytes(c.n); got != c.long {
			t.Errorf("FormatBytes(%d) = %q, want %q", c.n, got, c.long)
		}
		if got := FormatBytesShort(c.n); got != c.short {
			t.Errorf("FormatBytesShort(%d) = %q, want %q", c.n, got, c.short)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0ms"},
		{0, "0ms"},
		{120 * time.Millisecond, "120ms"},
		{1500 * time.Millisecond, "1.5s"},
		{45 * time.Second, "45s"},
		{192 * time.Second, "3m12s"},
		{3*time.Hour + 5*time.Minute, "3h05m"},
		{26 * time.Hour, "26h00m"},
		{47*time.Hour + 59*time.Minute, "47h59m"},
		{48 * time.Hour, "2d0h"},
		{50 * time.Hour, "2d2h"},
		{76 * time.Hour, "3d4h"},
	} {
		if got := FormatDuration(c.d); got != c.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestFormatAgo(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Minute, "now"},
		{0, "now"},
		{1900 * time.Millisecond, "now"},
		{30 * time.Second, "30s ago"},
		{5 * time.Minute, "5m ago"},
		{30 * time.Hour, "30h ago"},
		{47 * time.Hour, "47h ago"},
		{48 * time.Hour, "2d ago"},
		{72 * time.Hour, "3d ago"},
	} {
		if got := FormatAgo(c.d); got != c.want {
			t.Errorf("FormatAgo(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestParseCheckpointRef(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    CheckpointRef
		wantErr bool
	}{
		{"src@c1", CheckpointRef{"src", "c1"}, false},
		{"src", CheckpointRef{"src", ""}, false},
		{"a-0@c12345", CheckpointRef{"a-0", "c12345"}, false},
		{"", CheckpointRef{}, true},
		{"@c1", CheckpointRef{}, true},
		{"src@", CheckpointRef{}, true},
		{"Src@c1", CheckpointRef{}, true},
		{"src@C1", CheckpointRef{}, true},
		{"src@c1@c2", CheckpointRef{}, true},
		{"src@../x", CheckpointRef{}, true},
		{"src@" + strings.Repeat("c", maxCheckpointID+1), CheckpointRef{}, true},
		{"berth@c1", CheckpointRef{}, true},
	} {
		got, err := ParseCheckpointRef(c.in)
		if c.wantErr {
			if !errors.Is(err, ErrInvalid) || FieldOf(err) != FieldFrom {
				t.Errorf("ParseCheckpointRef(%q) = %+v, %v; want ErrInvalid of field from", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want || got.String() != c.in {
			t.Errorf("ParseCheckpointRef(%q) = %+v (%s), %v; want %+v", c.in, got, got, err, c.want)
		}
	}
}

func TestCheckCreateFrom(t *testing.T) {
	for _, c := range []struct {
		what  string
		opts  CreateOptions
		class error
		field string
	}{
		{"plain", CreateOptions{Name: "new", From: "src@c1"}, nil, ""},
		{"with resources", CreateOptions{Name: "new", From: "src", CPUs: 2, MemoryMiB: 1024, Net: "open"}, nil, ""},
		{"bad new name", CreateOptions{Name: "New", From: "src"}, ErrInvalid, ""},
		{"bad reference", CreateOptions{Name: "new", From: "src@"}, ErrInvalid, FieldFrom},
		{"image", CreateOptions{Name: "new", From: "src", Image: "debian"}, ErrInvalid, FieldImage},
		{"disk", CreateOptions{Name: "new", From: "src", DiskBytes: 1 << 30}, ErrInvalid, FieldDisk},
		{"system disk", CreateOptions{Name: "new", From: "src", SystemBytes: 1 << 30}, ErrInvalid, FieldSystemDisk},
	} {
		_, err := CheckCreateFrom(c.opts)
		if c.class == nil {
			if err != nil {
				t.Errorf("CheckCreateFrom %s: %v", c.what, err)
			}
			continue
		}
		if !errors.Is(err, c.class) || FieldOf(err) != c.field {
			t.Errorf("CheckCreateFrom %s = %v; want %v of field %q", c.what, err, c.class, c.field)
		}
	}
}

func TestPickCheckpoint(t *testing.T) {
	list := []Checkpoint{{ID: "c1"}, {ID: "c2"}, {ID: "c5"}}
	for _, c := range []struct {
		ref    CheckpointRef
		list   []Checkpoint
		want   string
		reason string // in the refusal
	}{
		{CheckpointRef{"s", "c2"}, list, "c2", ""},
		{CheckpointRef{"s", ""}, list, "c5", ""},
		{CheckpointRef{"s", "c3"}, list, "", `no checkpoint "c3"`},
		{CheckpointRef{"s", ""}, nil, "", "has no checkpoints"},
	} {
		got, err := PickCheckpoint(c.ref, c.list)
		if c.want != "" {
			if err != nil || got.ID != c.want {
				t.Errorf("PickCheckpoint(%s) = %s, %v; want %s", c.ref, got.ID, err, c.want)
			}
			continue
		}
		if !errors.Is(err, ErrNotFound) || FieldOf(err) != FieldFrom || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("PickCheckpoint(%s) = %v; want ErrNotFound of field from saying %q", c.ref, err, c.reason)
		}
	}
}

func TestFromSource(t *testing.T) {
	hour := time.Hour
	disk := CreateSource{Checkpoint: Checkpoint{ID: "c1"}, CPUs: 2, MemoryMiB: 512, VMM: "qemu", Net: "open", IdleTimeout: &hour}
	mem := disk
	mem.Checkpoint.Memory = true
	for _, c := range []struct {
		what  string
		opts  CreateOptions
		src   CreateSource
		want  CreateOptions // when no refusal
		class error
		field string
	}{
		{"the source's settings", CreateOptions{Name: "n"}, disk,
			CreateOptions{Name: "n", CPUs: 2, MemoryMiB: 512, VMM: "qemu", Net: "open", IdleTimeout: &hour}, nil, ""},
		{"a disk checkpoint on a bigger VM", CreateOptions{Name: "n", CPUs: 4, MemoryMiB: 1024, Net: "none"}, disk,
			CreateOptions{Name: "n", CPUs: 4, MemoryMiB: 1024, VMM: "qemu", Net: "none", IdleTimeout: &hour}, nil, ""},
		{"a memory checkpoint on its own size", CreateOptions{Name: "n", CPUs: 2, MemoryMiB: 512, VMM: "qemu"}, mem,
			CreateOptions{Name: "n", CPUs: 2, MemoryMiB: 512, VMM: "qemu", Net: "open", IdleTimeout: &hour}, nil, ""},
		{"a memory checkpoint on more CPUs", CreateOptions{Name: "n", CPUs: 4}, mem, CreateOptions{}, ErrInvalid, FieldCPUs},
		{"a memory checkpoint in more memory", CreateOptions{Name: "n", MemoryMiB: 1024}, mem, CreateOptions{}, ErrInvalid, FieldMemory},
		{"a memory checkpoint on another VMM", CreateOptions{Name: "n", VMM: "cloud-hypervisor"}, mem, CreateOptions{}, ErrInvalid, FieldVMM},
		{"memory below the minimum", CreateOptions{Name: "n", MemoryMiB: 64}, disk, CreateOptions{}, ErrInvalid, FieldMemory},
		{"a bad policy", CreateOptions{Name: "n", Net: "sometimes"}, disk, CreateOptions{}, ErrInvalid, FieldNet},
	} {
		got, err := c.opts.FromSource(c.src, Limits{DiskFree: 1 << 20})
		if c.class != nil {
			if !errors.Is(err, c.class) || FieldOf(err) != c.field {
				t.Errorf("FromSource %s = %v; want %v of field %q", c.what, err, c.class, c.field)
			}
			continue
		}
		if err != nil {
			t.Errorf("FromSource %s: %v", c.what, err)
			continue
		}
		if got.CPUs != c.want.CPUs || got.MemoryMiB != c.want.MemoryMiB || got.VMM != c.want.VMM || got.Net != c.want.Net ||
			got.IdleTimeout == nil || *got.IdleTimeout != *c.want.IdleTimeout || got.DiskBytes != 0 {
			t.Errorf("FromSource %s = %+v, want %+v", c.what, got, c.want)
		}
	}
}

func TestValidateUser(t *testing.T) {
	for spec, ok := range map[string]bool{
		"root": true, "app": true, "1000": true, "app:staff": true, "1000:1000": true, "www-data": true,
		"": false, "app:": false, ":staff": false, "a:b:c": false, "a b": false, "a\tb": false, "a\x00": false, "a\n": false,
		strings.Repeat("a", MaxUser): true, strings.Repeat("a", MaxUser+1): false,
	} {
		err := ValidateUser(spec)
		if ok != (err == nil) || err != nil && (!errors.Is(err, ErrInvalid) || FieldOf(err) != FieldUser) {
			t.Errorf("ValidateUser(%q) = %v, want ok %v (else ErrInvalid of field user)", spec, err, ok)
		}
	}
}

// isName is the regular expression ^[a-z0-9][a-z0-9-]{0,62}$ written as a
// loop (see its comment): both agree.
func TestIsNameIsTheExpression(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	for _, s := range []string{"", "a", "-", "a-", "-a", "A", "a_b", "web-1", "9", "a b", "é", "a\n",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "0" + strings.Repeat("-", 62), "0" + strings.Repeat("-", 63)} {
		if got, want := isName(s), re.MatchString(s); got != want {
			t.Errorf("isName(%q) = %v, the expression says %v", s, got, want)
		}
	}
}
