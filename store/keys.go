package store

import "encoding/binary"

// Key layout. Every key starts with its owner's namespace, so each owner's
// records can be scanned, migrated and versioned on their own:
//
//	meta/<owner>/schema                   owner's schema version, decimal
//	session/<name>                        Session, JSON
//	exec/<id>                             Exec (caller-owned fields), JSON
//	sexec/<session>/<id>                  empty; lists a session's execs
//	out/<exec>/<seq:8>                    chunk: segment range, or inline data (see segment.go)
//	outstate/<exec>                       output progress of one exec, JSON
//	outuse/<session>                      bytes of output stored, 8-byte BE
//	outorder/<session>/<started:8>/<exec> execs with stored output, oldest first
//	outtrim/<exec>/<block:8>              sizes of trimmed chunks (see trim.go)
//	event/<session>/<seq:8>               Event, JSON
//
// Numbers are 8-byte big endian so that byte order is numeric order and a
// prefix scan replays in sequence. Output data itself is not in badger but
// in output/<exec>.seg beside it.

const (
	ownerSession = "session"
	ownerExec    = "exec"
	ownerOut     = "out"
	ownerEvent   = "event"
)

func key(parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += len(p) + 1
	}
	b := make([]byte, 0, n+8)
	for i, p := range parts {
		if i > 0 {
			b = append(b, '/')
		}
		b = append(b, p...)
	}
	return b
}

// prefix returns key(parts...) + "/", the prefix of everything under it.
func prefix(parts ...string) []byte {
	return append(key(parts...), '/')
}

func appendUint64(b []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(b, v)
}

func schemaKey(owner string) []byte { return key("meta", owner, "schema") }

func sessionKey(name string) []byte { return key(ownerSession, name) }

func execKey(id string) []byte { return key(ownerExec, id) }

func sessionExecKey(session, id string) []byte { return key("sexec", session, id) }

func sessionExecPrefix(session string) []byte { return prefix("sexec", session) }

func chunkPrefix(execID string) []byte { return prefix(ownerOut, execID) }

func chunkKey(execID string, seq uint64) []byte {
	return appendUint64(chunkPrefix(execID), seq)
}

func outStateKey(execID string) []byte { return key("outstate", execID) }

func outUseKey(session string) []byte { return key("outuse", session) }

func outOrderPrefix(session string) []byte { return prefix("outorder", session) }

func outOrderKey(session string, started uint64, execID string) []byte {
	b := appendUint64(outOrderPrefix(session), started)
	b = append(b, '/')
	return append(b, execID...)
}

// outOrderExec extracts the exec id from an outorder key.
func outOrderExec(session string, k []byte) string {
	return string(k[len(outOrderPrefix(session))+9:])
}

func trimPrefix(execID string) []byte { return prefix("outtrim", execID) }

func trimKey(execID string, block uint64) []byte {
	return appendUint64(trimPrefix(execID), block)
}

func eventPrefix(session string) []byte { return prefix(ownerEvent, session) }

func eventKey(session string, seq uint64) []byte {
	return appendUint64(eventPrefix(session), seq)
}
