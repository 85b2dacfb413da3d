package redisstate

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The fleet's run-time changes (an operator's, made through a replica's
// admin endpoints) are one hash under the prefix, {changes}: field →
// the change, as the proxy writes it, sealed. Each replica polls the hash
// every ChangesEvery and hands the proxy the fields whose values are new
// to it, so a change reaches every replica within that time; a replica
// started later finds the changes in force there. The hash expires KeyTTL
// after the last replica's last poll.
//
// Redis is shared, so whoever may write to it could otherwise change
// every replica's limits. A change is therefore sealed: its value in the
// hash is "v1 <version> <mac> <change>", the mac an HMAC-SHA256 of the
// prefix, the field, the version and the change under a key derived from
// the admin token (ChangesToken) that every replica holds. A replica
// hands on only a change whose mac it computes itself, and only when its
// version is above the one in force for that field here: a change cannot
// be moved to another field or prefix, edited (its "by" included), or
// replayed over a later one. The version is the writer's clock in ms,
// raised past any version it has seen for the field, so the later of two
// changes wins. A replica started after a replay has nothing to compare
// with and takes the replayed change: the seal keeps out forgeries, not
// an old change of the token's own put back by hand.

// DefaultChangesEvery is Config.ChangesEvery's default: 250 ms (written
// in nanoseconds, so that the constant holds no arithmetic for a mutant).
const DefaultChangesEvery time.Duration = 250_000_000

// ErrNoChangesToken is PutChange's error on a store without a
// ChangesToken: a change it cannot seal stays on this replica.
var ErrNoChangesToken = errors.New("no admin token to sign the change with: it stays on this replica")

// changesLabel is what the changes' key is derived from the admin token
// with: the token itself keys nothing else than what it guards.
const changesLabel = "llmproxy fleet changes v1"

// sealVersion starts every sealed change.
const sealVersion = "v1"

// changesKey is the fleet's changes hash; its hash tag keeps it apart
// from every group's slot.
func (s *Store) changesKey() string { return s.cfg.Prefix + "{changes}" }

// changesKeyFrom is the key the changes are signed with, derived from
// the admin token; nil without one.
func changesKeyFrom(token string) []byte {
	if token == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(changesLabel))
	return m.Sum(nil)
}

// mac is the signature of value as field's change at version, in hex.
// Each part goes with its length, so no two sets of parts read alike.
func (s *Store) mac(field string, version int64, value string) string {
	m := hmac.New(sha256.New, s.signKey)
	for _, part := range []string{s.cfg.Prefix, field, strconv.FormatInt(version, 10), value} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		m.Write(n[:])
		m.Write([]byte(part))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// seal is value as field's change at version is written to the hash.
func (s *Store) seal(field string, version int64, value string) string {
	return sealVersion + " " + strconv.FormatInt(version, 10) + " " + s.mac(field, version, value) + " " + value
}

// unseal is the version and the change sealed in raw as field's, or why
// it is not one this replica may take.
func (s *Store) unseal(field, raw string) (int64, string, error) {
	parts := strings.SplitN(raw, " ", 4)
	if len(parts) != 4 || parts[0] != sealVersion {
		return 0, "", errors.New("not signed")
	}
	version, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || version <= 0 {
		return 0, "", errors.New("no version")
	}
	if !hmac.Equal([]byte(parts[2]), []byte(s.mac(field, version, parts[3]))) {
		return 0, "", errors.New("wrong signature (another admin token, or altered)")
	}
	return version, parts[3], nil
}

// putChangeScript writes ARGV[2] under field ARGV[1] of KEYS[1] unless
// the value there has a version of ARGV[3] or above (then it answers that
// value), or ARGV[5] forces it; and keeps the hash ARGV[4] ms more.
var putChangeScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and ARGV[5] ~= '1' then
  local v = tonumber(string.match(cur, '^v1 (%d+) '))
  if v and v >= tonumber(ARGV[3]) then
    return cur
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return false
`)

// PutChange sets field of the fleet's changes to value, sealed, for
// every replica, and its own polls take it as seen. Its error is Redis',
// or ErrNoChangesToken: the other replicas then do not hear of the
// change.
func (s *Store) PutChange(ctx context.Context, field, value string) error {
	if s.signKey == nil {
		return ErrNoChangesToken
	}
	if why := strayChange(field, s.seal(field, 1<<62, value)); why != "" {
		return fmt.Errorf("change %s: %s, so no replica would take it", clip(field, maxLoggedField), why)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	// A poll between the write and the note would read the old value
	// as another replica's.
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	version := max(s.now().UnixMilli(), s.changesVersion[field]+1)
	force := "0"
	for range 3 {
		sealed := s.seal(field, version, value)
		cur, err := putChangeScript.Run(ctx, s.rdb(), []string{s.changesKey()},
			field, sealed, version, max(1, s.cfg.KeyTTL.Milliseconds()), force).Text()
		s.commands.WithLabelValues("change").Inc()
		if errors.Is(err, redis.Nil) {
			s.changesSeen[field], s.changesVersion[field] = sealed, version
			return nil
		}
		if err != nil {
			return err
		}
		// A version as high or higher is there: another replica's change
		// made at the same time, on a clock ahead, goes before this one;
		// one this replica cannot read is overwritten.
		if v, _, err := s.unseal(field, cur); err == nil {
			version = v + 1
		} else {
			force = "1"
		}
	}
	return fmt.Errorf("the change of %s kept meeting later ones", field)
}

// WatchChanges hands apply each field of the fleet's changes whose value
// is new to this replica and signed: those in force at once (first set:
// the changes made before this replica started, or before Redis first
// answered it), then every ChangesEvery until Close. apply runs on one
// goroutine, one field at a time, and must not call PutChange. Without a
// ChangesToken it hands nothing: no change could be checked.
func (s *Store) WatchChanges(apply func(field, value string, first bool)) {
	if s.signKey == nil {
		return
	}
	polled := s.pollChanges(apply, true)
	s.watching.Add(1)
	go func() {
		defer s.watching.Done()
		tick := time.NewTicker(s.cfg.ChangesEvery)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
				if s.pollChanges(apply, !polled) {
					polled = true
				}
			}
		}
	}()
}

// maxLoggedField bounds the field an ignored change is logged with:
// anyone who can write to Redis chooses it.
const maxLoggedField = 200

// Whoever can write to Redis can add fields to the changes hash as fast
// as it likes, and every replica reads the whole hash every
// ChangesEvery: what a replica keeps and logs of it is bounded.
//
// changeField is the form of every field the proxy writes:
// route:<route name>:<kind> or lane:<lane ID>:<kind> (a route's name is
// letters, digits, '.', '_' and '-'; a lane's ID is hex), the name at
// most maxChangeName bytes. A sealed change is at most maxChangeValue
// bytes (a change is a small JSON object). Other fields, and longer
// values, are none a replica wrote: a poll passes over them, and logs
// that it met some once, not each. PutChange refuses them.
var changeField = regexp.MustCompile(`^(route|lane):[A-Za-z0-9._-]{1,200}:[a-z]{1,16}$`)

const (
	maxChangeName  = 200 // as changeField writes it (TestAChangeOfNoFormAReplicaTakesIsRefused holds the two together)
	maxChangeValue = 4096
	// maxChangesSeen bounds the fields a replica keeps (changesSeen): a
	// fleet's changes are a few per route and per lane operated on.
	maxChangesSeen = 10_000
	// maxIgnoredLogged bounds the changes one poll logs as ignored, one
	// line each; one more line counts the rest.
	maxIgnoredLogged = 10
)

// strayChange reports why field=raw is no change a replica could have
// written ("": it may be one).
func strayChange(field, raw string) string {
	if !changeField.MatchString(field) {
		return "not a route's or a lane's change"
	}
	if len(raw) > maxChangeValue {
		return "longer than any change"
	}
	return ""
}

// pollChanges reads the fleet's changes and hands apply the fields new
// to this replica, and keeps the hash alive another KeyTTL; it reports
// whether Redis answered. A change not signed with this replica's token,
// or older than the one in force, is logged once and not handed on.
// While the replica is local it asks nothing.
func (s *Store) pollChanges(apply func(field, value string, first bool), first bool) bool {
	if !s.up.Load() {
		return false
	}
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	key := s.changesKey()
	var all *redis.MapStringStringCmd
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, key)
		p.PExpire(ctx, key, s.cfg.KeyTTL)
		return nil
	})
	s.commands.WithLabelValues("changes").Inc()
	if err != nil {
		s.failed("changes", err)
		return false
	}
	s.takeChanges(all.Val(), apply, first)
	return true
}

// takeChanges hands apply the fields of the fleet's changes new to this
// replica and signed with its token, and logs those passed over (see
// pollChanges). The caller holds changesMu.
func (s *Store) takeChanges(fields map[string]string, apply func(field, value string, first bool), first bool) {
	// A field gone from the hash is forgotten: what is kept follows it.
	for field := range s.changesSeen {
		if _, ok := fields[field]; !ok {
			delete(s.changesSeen, field)
		}
	}
	stray, over, ignored := 0, 0, 0
	for field, raw := range fields {
		if strayChange(field, raw) != "" {
			stray++
			continue
		}
		seen, ok := s.changesSeen[field]
		if !ok && len(s.changesSeen) >= maxChangesSeen {
			over++
			continue
		}
		s.changesSeen[field] = raw
		if ok && seen == raw {
			continue
		}
		version, value, err := s.unseal(field, raw)
		if err == nil && version <= s.changesVersion[field] {
			err = fmt.Errorf("version %d is not above %d, the one in force here (a replay?)", version, s.changesVersion[field])
		}
		if err != nil {
			if ignored++; ignored <= maxIgnoredLogged {
				s.log.Warn("a change in redis ignored", "field", clip(field, maxLoggedField), "reason", err.Error())
			}
			continue
		}
		s.changesVersion[field] = version
		apply(field, value, first)
	}
	if ignored > maxIgnoredLogged {
		s.log.Warn("more changes in redis ignored", "count", ignored-maxIgnoredLogged)
	}
	if stray > 0 && !s.changesStray {
		s.log.Warn("fields in redis' changes passed over: none a replica writes (not logged again while some remain)", "count", stray)
	}
	if over > 0 && !s.changesOver {
		s.log.Warn("changes in redis passed over: past the most a replica keeps (not logged again while some remain)",
			"count", over, "most_kept", maxChangesSeen)
	}
	s.changesStray, s.changesOver = stray > 0, over > 0
}

// clip is s cut to at most n bytes, marked when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
