// Package msgpack reads and writes the subset of MessagePack kvgate speaks:
// engines' KV event batches (read only, without allocating, never trusting
// a length beyond the bytes present) and replica sync messages. It knows
// nothing of what the values mean.
package msgpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Reader reads msgpack values from a byte slice without allocating. It
// never trusts a length prefix beyond the bytes actually present, and
// bounds nesting when skipping. Strings and binaries it returns alias the
// slice.
type Reader struct {
	b   []byte
	off int
}

// NewReader returns a Reader of b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Len returns the number of bytes not yet read.
func (r *Reader) Len() int { return len(r.b) - r.off }

// Type is the family of a msgpack value.
type Type uint8

// The families of values.
const (
	Nil Type = iota
	Bool
	Int   // positive or negative integer of any width
	Float // float32 or float64
	Str
	Bin
	Array
	Map
	Ext
	Invalid
)

func (t Type) String() string {
	return [...]string{"nil", "bool", "int", "float", "str", "bin", "array", "map", "ext", "invalid"}[t]
}

// ErrTruncated: the input ends inside a value.
var ErrTruncated = errors.New("msgpack: truncated")

// MaxSkipDepth bounds the nesting of values skipped as unknown fields.
const MaxSkipDepth = 64

// Done reports whether every byte was read.
func (r *Reader) Done() bool { return r.off >= len(r.b) }

// Peek returns the family of the next value without consuming it.
func (r *Reader) Peek() Type {
	if r.off >= len(r.b) {
		return Invalid
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return Int
	case c <= 0x8f:
		return Map
	case c <= 0x9f:
		return Array
	case c <= 0xbf:
		return Str
	}
	switch c {
	case 0xc0:
		return Nil
	case 0xc2, 0xc3:
		return Bool
	case 0xc4, 0xc5, 0xc6:
		return Bin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return Ext
	case 0xca, 0xcb:
		return Float
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return Int
	case 0xd9, 0xda, 0xdb:
		return Str
	case 0xdc, 0xdd:
		return Array
	case 0xde, 0xdf:
		return Map
	}
	return Invalid // 0xc1 is never used
}

// readUint reads a size-byte big-endian unsigned integer.
func (r *Reader) readUint(size int) (uint64, error) {
	if len(r.b)-r.off < size {
		return 0, ErrTruncated
	}
	p := r.b[r.off : r.off+size]
	r.off += size
	switch size {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// TypeError returns an error saying the next value is not what was wanted.
func (r *Reader) TypeError(want string) error {
	return fmt.Errorf("msgpack: want %s, have %s at offset %d", want, r.Peek(), r.off)
}

// Nil consumes a nil and reports whether there was one.
func (r *Reader) Nil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// ArrayLen reads an array header.
func (r *Reader) ArrayLen() (int, error) { return r.header("array", 0x90, 0xdc, 1) }

// MapLen reads a map header.
func (r *Reader) MapLen() (int, error) { return r.header("map", 0x80, 0xde, 2) }

// header reads an array or map header: a fix form (fix | n, n < 16), a
// 16-bit form (code16) or a 32-bit form (code16+1). Each of the n elements
// takes at least per bytes, so a count the remaining bytes cannot hold is
// rejected before anyone allocates for it.
func (r *Reader) header(want string, fix, code16 byte, per uint64) (int, error) {
	if r.off >= len(r.b) {
		return 0, ErrTruncated
	}
	c := r.b[r.off]
	var l uint64
	var err error
	switch {
	case c&0xf0 == fix:
		r.off++
		l = uint64(c & 0x0f)
	case c == code16:
		r.off++
		l, err = r.readUint(2)
	case c == code16+1:
		r.off++
		l, err = r.readUint(4)
	default:
		return 0, r.TypeError(want)
	}
	if err != nil {
		return 0, err
	}
	if l > uint64(len(r.b)-r.off)/per {
		return 0, ErrTruncated
	}
	return int(l), nil
}

// Raw reads a str or bin value and returns its bytes (aliasing the input).
func (r *Reader) Raw() ([]byte, error) {
	if r.off >= len(r.b) {
		return nil, ErrTruncated
	}
	c := r.b[r.off]
	var l uint64
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		l = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.off++
		l, err = r.readUint(1)
	case c == 0xda || c == 0xc5:
		r.off++
		l, err = r.readUint(2)
	case c == 0xdb || c == 0xc6:
		r.off++
		l, err = r.readUint(4)
	default:
		return nil, r.TypeError("str or bin")
	}
	if err != nil {
		return nil, err
	}
	if l > uint64(len(r.b)-r.off) {
		return nil, ErrTruncated
	}
	p := r.b[r.off : r.off+int(l)]
	r.off += int(l)
	return p, nil
}

// Int reads an integer of any width. A value above MaxInt64 comes back as
// its uint64 bit pattern with big set; negative values have big false.
func (r *Reader) Int() (v int64, big bool, err error) {
	if r.off >= len(r.b) {
		return 0, false, ErrTruncated
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f:
		r.off++
		return int64(c), false, nil
	case c >= 0xe0:
		r.off++
		return int64(int8(c)), false, nil
	}
	var u uint64
	switch c {
	case 0xcc, 0xd0:
		r.off++
		u, err = r.readUint(1)
		if c == 0xd0 {
			return int64(int8(u)), false, err
		}
	case 0xcd, 0xd1:
		r.off++
		u, err = r.readUint(2)
		if c == 0xd1 {
			return int64(int16(u)), false, err
		}
	case 0xce, 0xd2:
		r.off++
		u, err = r.readUint(4)
		if c == 0xd2 {
			return int64(int32(u)), false, err
		}
	case 0xcf, 0xd3:
		r.off++
		u, err = r.readUint(8)
		if c == 0xcf && u > math.MaxInt64 {
			return int64(u), true, err
		}
	default:
		return 0, false, r.TypeError("int")
	}
	return int64(u), false, err
}

// Uint64Bits reads an integer and returns its 64-bit pattern: uint64 values
// as they are, negative int64 values reinterpreted (SGLang's hashes).
func (r *Reader) Uint64Bits() (uint64, error) {
	v, _, err := r.Int()
	return uint64(v), err
}

// Float reads a float or an integer as float64.
func (r *Reader) Float() (float64, error) {
	if r.off >= len(r.b) {
		return 0, ErrTruncated
	}
	switch r.b[r.off] {
	case 0xca:
		r.off++
		u, err := r.readUint(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		r.off++
		u, err := r.readUint(8)
		return math.Float64frombits(u), err
	}
	if r.Peek() == Int {
		v, big, err := r.Int()
		if big {
			return float64(uint64(v)), err
		}
		return float64(v), err
	}
	return 0, r.TypeError("float")
}

// Skip consumes one value of any type.
func (r *Reader) Skip() error { return r.SkipDepth(0) }

// SkipDepth consumes one value nested depth levels deep in what the
// caller skips, failing beyond MaxSkipDepth.
func (r *Reader) SkipDepth(depth int) error {
	if depth > MaxSkipDepth {
		return fmt.Errorf("msgpack: nesting deeper than %d", MaxSkipDepth)
	}
	if r.off >= len(r.b) {
		return ErrTruncated
	}
	c := r.b[r.off]
	switch t := r.Peek(); t {
	case Nil, Bool:
		r.off++
		return nil
	case Int:
		_, _, err := r.Int()
		return err
	case Float:
		_, err := r.Float()
		return err
	case Str, Bin:
		_, err := r.Raw()
		return err
	case Array:
		l, err := r.ArrayLen()
		for i := 0; i < l && err == nil; i++ {
			err = r.SkipDepth(depth + 1)
		}
		return err
	case Map:
		l, err := r.MapLen()
		for i := 0; i < 2*l && err == nil; i++ {
			err = r.SkipDepth(depth + 1)
		}
		return err
	case Ext:
		r.off++
		var size uint64
		var err error
		switch c {
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
			size = 1 << (c - 0xd4)
		case 0xc7:
			size, err = r.readUint(1)
		case 0xc8:
			size, err = r.readUint(2)
		case 0xc9:
			size, err = r.readUint(4)
		}
		if err != nil {
			return err
		}
		size++ // the type byte
		if size > uint64(len(r.b)-r.off) {
			return ErrTruncated
		}
		r.off += int(size)
		return nil
	}
	return fmt.Errorf("msgpack: invalid byte 0x%02x at offset %d", c, r.off)
}
