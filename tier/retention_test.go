package tier

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

func retentionTestPage() (PageFormat, RemotePage) {
	fm := PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 2, Layers: 1}
	p := RemotePage{Tokens: []int32{5, 6}, Data: bytes.Repeat([]byte{7}, fm.PageBytes())}
	p.Parent = NamespaceRoot("", "", "")
	p.Digest = Next(nil, p.Parent, p.Tokens)
	return fm, p
}

// TestValueWithoutRetentionIsUnchanged pins a value without retention to
// the bytes main wrote before the retention field existed (the SHA-256
// computed on a5dc77a): old values decode, new ones without retention are
// the same bytes.
func TestValueWithoutRetentionIsUnchanged(t *testing.T) {
	fm, p := retentionTestPage()
	b, err := EncodeValue(nil, fm, "ns", "all", &p)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	require.Equal(t, "ac2178306587548cc509d84dd055ff0c655f50867a2891a271df87fe20cd193d", hex.EncodeToString(sum[:]))
	require.Len(t, b, EncodedValueLen(fm, "ns", "all"))
	v, err := DecodeValue(b, nil)
	require.NoError(t, err)
	require.Zero(t, v.Retention)
}

// TestValueRetentionRoundTrip: a retention rides in the value (flags bit
// 0x02) with its deadline on the writer's wall clock; a reader later gets
// what is left, level 0 once the deadline has passed.
func TestValueRetentionRoundTrip(t *testing.T) {
	fm, p := retentionTestPage()
	t0 := time.Unix(1_800_000_000, 0)
	p.Retention = Retention{Priority: 3, Hint: 1, Duration: time.Minute, Left: 40 * time.Second}
	b, err := EncodeValueAt(nil, fm, "ns", "all", &p, t0)
	require.NoError(t, err)
	require.Len(t, b, EncodedValueLenOf(fm, "ns", "all", &p))
	require.Equal(t, EncodedValueLen(fm, "ns", "all")+retentionBytes, len(b))
	require.Equal(t, byte(valueRetention), b[7], "flags")
	v, err := DecodeValue(b, nil)
	require.NoError(t, err)
	require.NoError(t, v.Verify(fm, "ns", "all", &p))
	require.Equal(t, ValueRetention{Priority: 3, Hint: 1, Duration: time.Minute, Deadline: t0.Add(40 * time.Second).UnixNano()}, v.Retention)
	require.Equal(t, Retention{Priority: 3, Hint: 1, Duration: time.Minute, Left: 30 * time.Second}, v.Retention.At(t0.Add(10*time.Second)))
	require.Equal(t, Retention{Hint: 1}, v.Retention.At(t0.Add(40*time.Second)), "lapsed at the deadline")
	// A level without a duration never lapses.
	p.Retention = Retention{Priority: 2}
	b, err = EncodeValueAt(nil, fm, "ns", "all", &p, t0)
	require.NoError(t, err)
	v, err = DecodeValue(b, nil)
	require.NoError(t, err)
	require.Equal(t, Retention{Priority: 2}, v.Retention.At(t0.Add(1000*time.Hour)))
	// Every decoder agrees on it.
	dst := make([]byte, fm.PageBytes())
	vi, err := DecodeValueInto(dst, b, nil)
	require.NoError(t, err)
	require.Equal(t, v.Retention, vi.Retention)
}

// TestValueRetentionRefusesBadFields names each bad field.
func TestValueRetentionRefusesBadFields(t *testing.T) {
	fm, p := retentionTestPage()
	for _, c := range []struct {
		r    Retention
		want string
	}{
		{Retention{Priority: 16}, "retention priority 16"},
		{Retention{Hint: 3}, "retention hint 3"},
		{Retention{Priority: 1, Duration: -1}, "retention duration -1ns"},
		{Retention{Priority: 1, Duration: 367 * 24 * time.Hour, Left: time.Second}, "retention duration 8808h"},
		{Retention{Priority: 1, Duration: time.Second, Left: 2 * time.Second}, "2s left of a duration of 1s"},
		{Retention{Priority: 1, Left: time.Second}, "1s left of no duration"},
	} {
		p.Retention = c.r
		_, err := EncodeValue(nil, fm, "ns", "all", &p)
		require.ErrorContains(t, err, c.want)
	}
	// Damaged fields behind a good checksum are refused by name.
	p.Retention = Retention{Priority: 1, Duration: time.Second, Left: time.Second}
	good, err := EncodeValueAt(nil, fm, "ns", "all", &p, time.Unix(100, 0))
	require.NoError(t, err)
	off := valueHeaderBytes
	for _, c := range []struct {
		at   int
		val  byte
		want string
	}{
		{0, 16, "retention priority 16"},
		{1, 9, "retention hint 9"},
		{5, 1, "reserved bytes"},
		{15, 0x80, "retention duration"},
		{23, 0x80, "retention deadline"},
	} {
		b := bytes.Clone(good)
		b[off+c.at] = c.val
		_, err := DecodeValue(fixCRC(b), nil)
		require.ErrorIs(t, err, ErrCorruptValue)
		require.ErrorContains(t, err, c.want)
	}
	// The empty field is not a second encoding of "no retention".
	b := bytes.Clone(good)
	clear(b[off : off+retentionBytes])
	_, err = DecodeValue(fixCRC(b), nil)
	require.ErrorContains(t, err, "present but empty")
}

func fixCRC(b []byte) []byte {
	body := b[:len(b)-valueCRCBytes]
	binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, CRCTable))
	return b
}

// TestLapsesMatchesModel runs random Set, Remove and Due against a map.
func TestLapsesMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		n := 1 + rng.IntN(40)
		l := NewLapses(n)
		model := map[int32]time.Duration{}
		for range 400 {
			id := int32(rng.IntN(n))
			switch rng.IntN(3) {
			case 0:
				at := time.Duration(rng.IntN(50))
				l.Set(id, at)
				model[id] = at
			case 1:
				l.Remove(id)
				delete(model, id)
			default:
				now := time.Duration(rng.IntN(50))
				got, ok := l.Due(now)
				want, wantOK := int32(-1), false
				for x, at := range model {
					if at <= now && (!wantOK || at < model[want] || at == model[want] && x < want) {
						want, wantOK = x, true
					}
				}
				require.Equal(t, wantOK, ok)
				if ok {
					require.Equal(t, want, got)
				}
			}
			require.NoError(t, l.Check())
			require.Equal(t, len(model), l.Len())
			for x, at := range model {
				got, ok := l.Deadline(x)
				require.True(t, ok)
				require.Equal(t, at, got)
			}
		}
	}
}

// FuzzValueRetention feeds raw bytes to the retention field's parser (a
// Redis value's field, a disk slot header's): it never panics, accepts
// only a field within the limits, and what it accepts re-encodes to the
// same bytes and gives, at any time, a retention that checks.
func FuzzValueRetention(f *testing.F) {
	f.Add(AppendValueRetention(nil, ValueRetention{Priority: 3, Hint: 1, Duration: time.Minute, Deadline: 1e18}), int64(1e18-1))
	f.Add(AppendValueRetention(nil, ValueRetention{Priority: 1}), int64(0))
	f.Add(make([]byte, retentionBytes), int64(0))
	f.Add([]byte{1, 2, 3}, int64(0))
	f.Fuzz(func(t *testing.T, b []byte, at int64) {
		v, err := ParseValueRetention(b)
		if err != nil {
			return
		}
		if again := AppendValueRetention(nil, v); !bytes.Equal(again, b) {
			t.Fatalf("accepted field %x re-encodes to %x", b, again)
		}
		if err := v.At(time.Unix(0, at)).Check(); err != nil {
			t.Fatalf("accepted field %+v gives at %d a retention that does not check: %v", v, at, err)
		}
	})
}
