package msgpack

import "encoding/binary"

// AppendMapHeader appends the header of a map of n key-value pairs.
func AppendMapHeader(b []byte, n int) []byte { return appendHeader(b, 0x80, 0xde, n) }

// AppendArrayHeader appends the header of an array of n values.
func AppendArrayHeader(b []byte, n int) []byte { return appendHeader(b, 0x90, 0xdc, n) }

func appendHeader(b []byte, fix, code16 byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, code16), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, code16+1), uint32(n))
	}
}

// AppendString appends s as a str value.
func AppendString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= 0xff:
		b = append(b, 0xd9, byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// AppendUint appends v in the shortest form.
func AppendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
	}
}

// AppendInt appends v in the shortest form (as an unsigned value when v is
// not negative).
func AppendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= -0x80:
		return append(b, 0xd0, byte(v))
	case v >= -0x8000:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= -0x80000000:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
	}
}
