package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// A migration brings one owner's records from schema version N to N+1.
type migration func(txn *badger.Txn) error

// migrations lists, per owner, the steps from v1 onwards: migrations[o][i]
// goes from v(i+1) to v(i+2), so an owner's current version is
// len(migrations[o])+1. Append steps; never edit a released one.
var migrations = map[string][]migration{
	ownerSession: {sessionV1ToV2},
	ownerExec:    {execV1ToV2},
	ownerOut:     {outV1ToV2},
	ownerEvent:   nil,
	// Runs and schedules start at v1.
	ownerRun:      nil,
	ownerSchedule: nil,
}

// owners fixes the order in which owners are checked and migrated.
var owners = []string{ownerSession, ownerExec, ownerOut, ownerEvent, ownerRun, ownerSchedule}

func knownVersion(owner string) int { return len(migrations[owner]) + 1 }

// SchemaError reports a store written by a newer berth; opening it would
// risk misreading or damaging records this version does not understand.
type SchemaError struct {
	Owner string
	Have  int // version in the store
	Know  int // newest version this berth can read
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("store schema for %s is v%d, this berth knows v%d: upgrade berth", e.Owner, e.Have, e.Know)
}

// migrate brings every owner to its current schema in one transaction, so
// a crash or a failing step leaves the store exactly as the previous berth
// wrote it. An owner without a version has never stored anything and
// starts at the current one.
func (s *Store) migrate() error {
	type step struct {
		owner    string
		from, to int
	}
	var done []step
	err := s.db.Update(func(txn *badger.Txn) error {
		done = done[:0]
		have := make(map[string]int, len(owners))
		for _, owner := range owners {
			v, err := readSchema(txn, owner)
			if err != nil {
				return err
			}
			if v > knownVersion(owner) {
				return &SchemaError{Owner: owner, Have: v, Know: knownVersion(owner)}
			}
			have[owner] = v
		}
		for _, owner := range owners {
			from, know := have[owner], knownVersion(owner)
			if from == know {
				continue
			}
			// Only now does the transaction write anything.
			if err := s.space.room(0); err != nil {
				return err
			}
			if from == 0 {
				from = know
			}
			for v := from; v < know; v++ {
				if err := migrations[owner][v-1](txn); err != nil {
					return fmt.Errorf("migrate %s records from v%d to v%d: %w", owner, v, v+1, err)
				}
			}
			if err := txn.Set(schemaKey(owner), []byte(strconv.Itoa(know))); err != nil {
				return err
			}
			if have[owner] != 0 {
				done = append(done, step{owner, have[owner], know})
			}
		}
		return nil
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		return fmt.Errorf("open store: migration does not fit in one transaction; this berth cannot upgrade a store this large: %w", err)
	}
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	for _, d := range done {
		s.log.Info("migrated store records", "owner", d.owner, "from", d.from, "to", d.to)
	}
	return nil
}

// readSchema returns owner's schema version, 0 if it has none.
func readSchema(txn *badger.Txn, owner string) (int, error) {
	item, err := txn.Get(schemaKey(owner))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var v int
	err = item.Value(func(b []byte) error {
		var err error
		v, err = strconv.Atoi(string(b))
		if err != nil || v < 1 {
			return fmt.Errorf("schema version of %s: %q is not a version", owner, b)
		}
		return nil
	})
	return v, err
}

// outV1ToV2: v2 stores output data in segment files, so a chunk value
// may be a segment record (see segment.go); inline v1 values stay as they
// are and are read, trimmed and deleted as before. Nothing is rewritten:
// the version is there so that an older berth, which would take segment
// records for data, refuses the store instead.
func outV1ToV2(*badger.Txn) error { return nil }

// execV1ToV2: v1 exec records kept the whole environment ("env":
// ["NAME=value", ...]), which put secrets on disk, and did not record who
// started the command. v2 keeps only the names ("env_names") and marks old
// records' starter as "unknown". The overwritten values linger in badger's
// value log until compaction and GC reclaim it.
func execV1ToV2(txn *badger.Txn) error {
	return rewriteRecords(txn, ownerExec, func(k []byte, rec map[string]json.RawMessage) (bool, error) {
		if raw, ok := rec["env"]; ok {
			var env []string
			if err := json.Unmarshal(raw, &env); err != nil {
				return false, fmt.Errorf("record %q: env: %w", k, err)
			}
			names := make([]string, 0, len(env))
			for _, kv := range env {
				name, _, _ := strings.Cut(kv, "=")
				names = append(names, name)
			}
			delete(rec, "env")
			if _, ok := rec["env_names"]; !ok && len(names) > 0 {
				var err error
				if rec["env_names"], err = json.Marshal(names); err != nil {
					return false, err
				}
			}
		}
		if _, ok := rec["by"]; !ok {
			rec["by"] = json.RawMessage(`"unknown"`)
		}
		return true, nil
	})
}

// sessionV1ToV2: v1 session records kept the workspace UUID, the session's
// own idle timeout, the sleep snapshot's path and size and the last wake's
// duration as strings in a map: "extra": {"uuid": "…", "idle_timeout":
// "30m0s", "snapshot": "/…/memory.snap", "snapshot_bytes": "536870912",
// "wake_ms": "412"}. v2 gives each a typed field and has no map.
//
// A missing key leaves its field unset. A value that does not parse (or is
// not a string) is dropped, which is what v1 made of it on every read: an
// unparsable idle timeout meant the configured one, an unparsable size or
// wake time meant none. The open does not fail for it. No berth wrote other
// keys; any there go with the map. A record that is not JSON, or whose
// "extra" is not an object, fails the migration (v1 could not load it
// either).
func sessionV1ToV2(txn *badger.Txn) error {
	return rewriteRecords(txn, ownerSession, func(k []byte, rec map[string]json.RawMessage) (bool, error) {
		raw, ok := rec["extra"]
		if !ok {
			return false, nil
		}
		var extra map[string]json.RawMessage
		if err := json.Unmarshal(raw, &extra); err != nil {
			return false, fmt.Errorf("record %q: extra: %w", k, err)
		}
		str := func(key string) (string, bool) {
			var s string
			err := json.Unmarshal(extra[key], &s)
			return s, err == nil && s != ""
		}
		// Marshalling a string or an integer cannot fail.
		set := func(field string, val any) {
			if _, ok := rec[field]; !ok {
				rec[field], _ = json.Marshal(val)
			}
		}
		if s, ok := str("uuid"); ok {
			set("workspace_uuid", s)
		}
		if s, ok := str("idle_timeout"); ok {
			if d, err := time.ParseDuration(s); err == nil {
				set("idle_timeout", d)
			}
		}
		if s, ok := str("snapshot"); ok {
			set("snapshot_path", s)
		}
		if s, ok := str("snapshot_bytes"); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n != 0 {
				set("snapshot_bytes", n)
			}
		}
		if s, ok := str("wake_ms"); ok {
			const most = math.MaxInt64 / int64(time.Millisecond)
			if ms, err := strconv.ParseInt(s, 10, 64); err == nil && ms != 0 && -most <= ms && ms <= most {
				set("last_wake", time.Duration(ms)*time.Millisecond)
			}
		}
		delete(rec, "extra")
		return true, nil
	})
}

// rewriteRecords calls fn with each JSON record under owner's prefix,
// decoded as a map so that fields a migration does not know are kept, and
// stores the record again where fn reports a change. A record that is not
// a JSON object fails the migration.
func rewriteRecords(txn *badger.Txn, owner string, fn func(k []byte, rec map[string]json.RawMessage) (bool, error)) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(owner)})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		k := item.KeyCopy(nil)
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		changed, err := fn(k, rec)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		nv, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if err := txn.Set(k, nv); err != nil {
			return err
		}
	}
	return nil
}
