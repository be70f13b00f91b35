package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// mpReader reads msgpack values from a byte slice without allocating. It is
// the minimum the event decoders need: it never trusts a length prefix beyond
// the bytes actually present, and bounds nesting when skipping.
type mpReader struct {
	b   []byte
	off int
}

// mpType is the family of the next msgpack value.
type mpType uint8

const (
	mpNil mpType = iota
	mpBool
	mpInt   // positive or negative integer of any width
	mpFloat // float32 or float64
	mpStr
	mpBin
	mpArray
	mpMap
	mpExt
	mpInvalid
)

func (t mpType) String() string {
	return [...]string{"nil", "bool", "int", "float", "str", "bin", "array", "map", "ext", "invalid"}[t]
}

var errTruncated = errors.New("msgpack: truncated")

// maxSkipDepth bounds the nesting of values skipped as unknown fields.
const maxSkipDepth = 64

func (r *mpReader) done() bool { return r.off >= len(r.b) }

// peek returns the family of the next value without consuming it.
func (r *mpReader) peek() mpType {
	if r.off >= len(r.b) {
		return mpInvalid
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return mpInt
	case c <= 0x8f:
		return mpMap
	case c <= 0x9f:
		return mpArray
	case c <= 0xbf:
		return mpStr
	}
	switch c {
	case 0xc0:
		return mpNil
	case 0xc2, 0xc3:
		return mpBool
	case 0xc4, 0xc5, 0xc6:
		return mpBin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return mpExt
	case 0xca, 0xcb:
		return mpFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return mpInt
	case 0xd9, 0xda, 0xdb:
		return mpStr
	case 0xdc, 0xdd:
		return mpArray
	case 0xde, 0xdf:
		return mpMap
	}
	return mpInvalid // 0xc1 is never used
}

// n reads an n-byte big-endian unsigned integer.
func (r *mpReader) n(size int) (uint64, error) {
	if len(r.b)-r.off < size {
		return 0, errTruncated
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

func (r *mpReader) typeErr(want string) error {
	return fmt.Errorf("msgpack: want %s, have %s at offset %d", want, r.peek(), r.off)
}

// nil consumes a nil and reports whether there was one.
func (r *mpReader) nil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header.
func (r *mpReader) arrayLen() (int, error) { return r.header("array", 0x90, 0xdc, 1) }

// mapLen reads a map header.
func (r *mpReader) mapLen() (int, error) { return r.header("map", 0x80, 0xde, 2) }

// header reads an array or map header: a fix form (fix | n, n < 16), a
// 16-bit form (code16) or a 32-bit form (code16+1). Each of the n elements
// takes at least per bytes, so a count the remaining bytes cannot hold is
// rejected before anyone allocates for it.
func (r *mpReader) header(want string, fix, code16 byte, per uint64) (int, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
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
		l, err = r.n(2)
	case c == code16+1:
		r.off++
		l, err = r.n(4)
	default:
		return 0, r.typeErr(want)
	}
	if err != nil {
		return 0, err
	}
	if l > uint64(len(r.b)-r.off)/per {
		return 0, errTruncated
	}
	return int(l), nil
}

// raw reads a str or bin value and returns its bytes (aliasing the input).
func (r *mpReader) raw() ([]byte, error) {
	if r.off >= len(r.b) {
		return nil, errTruncated
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
		l, err = r.n(1)
	case c == 0xda || c == 0xc5:
		r.off++
		l, err = r.n(2)
	case c == 0xdb || c == 0xc6:
		r.off++
		l, err = r.n(4)
	default:
		return nil, r.typeErr("str or bin")
	}
	if err != nil {
		return nil, err
	}
	if l > uint64(len(r.b)-r.off) {
		return nil, errTruncated
	}
	p := r.b[r.off : r.off+int(l)]
	r.off += int(l)
	return p, nil
}

// int reads an integer of any width. A value above MaxInt64 comes back as
// its uint64 bit pattern with big set; negative values have big false.
func (r *mpReader) int() (v int64, big bool, err error) {
	if r.off >= len(r.b) {
		return 0, false, errTruncated
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
		u, err = r.n(1)
		if c == 0xd0 {
			return int64(int8(u)), false, err
		}
	case 0xcd, 0xd1:
		r.off++
		u, err = r.n(2)
		if c == 0xd1 {
			return int64(int16(u)), false, err
		}
	case 0xce, 0xd2:
		r.off++
		u, err = r.n(4)
		if c == 0xd2 {
			return int64(int32(u)), false, err
		}
	case 0xcf, 0xd3:
		r.off++
		u, err = r.n(8)
		if c == 0xcf && u > math.MaxInt64 {
			return int64(u), true, err
		}
	default:
		return 0, false, r.typeErr("int")
	}
	return int64(u), false, err
}

// uint64Bits reads an integer and returns its 64-bit pattern: uint64 values
// as they are, negative int64 values reinterpreted (SGLang's hashes).
func (r *mpReader) uint64Bits() (uint64, error) {
	v, _, err := r.int()
	return uint64(v), err
}

// float reads a float or an integer as float64.
func (r *mpReader) float() (float64, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	switch r.b[r.off] {
	case 0xca:
		r.off++
		u, err := r.n(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		r.off++
		u, err := r.n(8)
		return math.Float64frombits(u), err
	}
	if r.peek() == mpInt {
		v, big, err := r.int()
		if big {
			return float64(uint64(v)), err
		}
		return float64(v), err
	}
	return 0, r.typeErr("float")
}

// skip consumes one value of any type.
func (r *mpReader) skip() error { return r.skipDepth(0) }

func (r *mpReader) skipDepth(depth int) error {
	if depth > maxSkipDepth {
		return fmt.Errorf("msgpack: nesting deeper than %d", maxSkipDepth)
	}
	if r.off >= len(r.b) {
		return errTruncated
	}
	c := r.b[r.off]
	switch t := r.peek(); t {
	case mpNil, mpBool:
		r.off++
		return nil
	case mpInt:
		_, _, err := r.int()
		return err
	case mpFloat:
		_, err := r.float()
		return err
	case mpStr, mpBin:
		_, err := r.raw()
		return err
	case mpArray:
		l, err := r.arrayLen()
		for i := 0; i < l && err == nil; i++ {
			err = r.skipDepth(depth + 1)
		}
		return err
	case mpMap:
		l, err := r.mapLen()
		for i := 0; i < 2*l && err == nil; i++ {
			err = r.skipDepth(depth + 1)
		}
		return err
	case mpExt:
		r.off++
		var size uint64
		var err error
		switch c {
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
			size = 1 << (c - 0xd4)
		case 0xc7:
			size, err = r.n(1)
		case 0xc8:
			size, err = r.n(2)
		case 0xc9:
			size, err = r.n(4)
		}
		if err != nil {
			return err
		}
		size++ // the type byte
		if size > uint64(len(r.b)-r.off) {
			return errTruncated
		}
		r.off += int(size)
		return nil
	}
	return fmt.Errorf("msgpack: invalid byte 0x%02x at offset %d", c, r.off)
}

// unsafeString views p as a string without copying. The string must not
// outlive p's next modification; callers compare it or clone it.
func unsafeString(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	return unsafe.String(&p[0], len(p))
}
