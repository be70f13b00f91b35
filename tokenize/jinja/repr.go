package jinja

// Python's str() and repr() of template values.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
)

// String returns Python's str(v), what {{ v }} prints ("" for Undefined).
func (v Value) String() string {
	switch v.k {
	case KindString:
		return v.s
	case KindUndefined:
		return ""
	}
	var b strings.Builder
	writeStr(&b, v)
	return b.String()
}

func writeStr(b *strings.Builder, v Value) { writeStrDepth(b, v, 0) }

// maxReprDepth bounds printing of nested (possibly self-referencing namespace) values;
// Python would raise RecursionError, we print "...".
const maxReprDepth = 500

func writeStrDepth(b *strings.Builder, v Value, depth int) {
	if depth > maxReprDepth {
		b.WriteString("...")
		return
	}
	switch v.k {
	case KindString:
		b.WriteString(v.s)
	case KindUndefined:
	case KindNone:
		b.WriteString("None")
	case KindBool:
		if v.n != 0 {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case KindInt:
		var buf [24]byte
		b.Write(strconv.AppendInt(buf[:0], v.n, 10))
	case kindBig:
		b.WriteString(v.o.(*big.Int).String())
	case KindFloat:
		b.WriteString(floatRepr(v.f))
	case KindList, kindTuple, KindDict:
		writeReprDepth(b, v, depth+1)
	case kindNamespace:
		b.WriteString("<Namespace {")
		ns := v.o.(*namespace)
		for i, k := range ns.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeStrRepr(b, k)
			b.WriteString(": ")
			writeReprDepth(b, ns.vals[i], depth+1)
		}
		b.WriteString("}>")
	case kindFunc:
		c := v.o.(*callable)
		if c.macro != nil {
			b.WriteString("<Macro ")
			writeStrRepr(b, c.name)
			b.WriteString(">")
		} else {
			b.WriteString("<function ")
			b.WriteString(c.name)
			b.WriteString(">")
		}
	case kindGenerator:
		g := v.o.(*generator)
		if g.name == "generator" {
			b.WriteString("<generator object " + g.fn + ">")
		} else {
			b.WriteString("<" + g.name + " object>")
		}
	case kindView:
		w := v.o.(*dictView)
		b.WriteString(w.name + "([")
		for i, it := range w.items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, it, depth+1)
		}
		b.WriteString("])")
	case kindLoop:
		l := v.o.(*loopContext)
		b.WriteString("<LoopContext ")
		b.WriteString(strconv.Itoa(l.index0 + 1))
		b.WriteString("/")
		b.WriteString(strconv.Itoa(len(l.items)))
		b.WriteString(">")
	default:
		b.WriteString("<")
		b.WriteString(v.TypeName())
		b.WriteString(" object>")
	}
}

// Repr returns Python's repr(v).
func (v Value) Repr() string {
	var b strings.Builder
	writeRepr(&b, v)
	return b.String()
}

func writeRepr(b *strings.Builder, v Value) { writeReprDepth(b, v, 0) }

func writeReprDepth(b *strings.Builder, v Value, depth int) {
	if depth > maxReprDepth {
		b.WriteString("...")
		return
	}
	switch v.k {
	case KindString:
		writeStrRepr(b, v.s)
	case KindUndefined:
		b.WriteString("Undefined")
	case KindList:
		b.WriteByte('[')
		for i, it := range v.list().items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, it, depth+1)
		}
		b.WriteByte(']')
	case kindTuple:
		items := v.list().items
		b.WriteByte('(')
		for i, it := range items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, it, depth+1)
		}
		if len(items) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case KindDict:
		d := v.dict()
		b.WriteByte('{')
		for i := range d.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, d.keys[i], depth+1)
			b.WriteString(": ")
			writeReprDepth(b, d.vals[i], depth+1)
		}
		b.WriteByte('}')
	default:
		writeStrDepth(b, v, depth)
	}
}

// pyQuote is repr() of a str.
func pyQuote(s string) string {
	var b strings.Builder
	writeStrRepr(&b, s)
	return b.String()
}

// writeStrRepr writes Python's repr of a str: single quotes unless the string contains
// a single quote and no double quote; non-printable characters escaped.
func writeStrRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\x`)
			b.WriteString(hex(uint32(r), 2))
		case r < 0x7f:
			b.WriteRune(r)
		case pyPrintable(r):
			b.WriteRune(r)
		case r < 0x100:
			b.WriteString(`\x`)
			b.WriteString(hex(uint32(r), 2))
		case r < 0x10000:
			b.WriteString(`\u`)
			b.WriteString(hex(uint32(r), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(hex(uint32(r), 8))
		}
	}
	b.WriteByte(quote)
}

// pyPrintable approximates Python's str.isprintable for one character: everything but
// the Other and Separator categories, except the ASCII space.
func pyPrintable(r rune) bool {
	if r == ' ' {
		return true
	}
	return unicode.IsPrint(r)
}

func hex(v uint32, width int) string {
	s := strconv.FormatUint(uint64(v), 16)
	for len(s) < width {
		s = "0" + s
	}
	return s
}

// floatRepr is Python's repr(float): the shortest round-tripping digits, in fixed
// notation when the decimal exponent is in [-4, 16), with at least one fractional digit.
func floatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	// e is like "-1.2345e+06" or "5e-07".
	neg := false
	if e[0] == '-' {
		neg = true
		e = e[1:]
	}
	ei := strings.IndexByte(string(e), 'e')
	mant := string(e[:ei])
	exp, _ := strconv.Atoi(string(e[ei+1:]))
	digits := strings.Replace(mant, ".", "", 1)
	var out strings.Builder
	if neg {
		out.WriteByte('-')
	}
	decpt := exp + 1 // position of the decimal point relative to the digits
	if decpt > -4 && decpt <= 16 {
		switch {
		case decpt <= 0:
			out.WriteString("0.")
			out.WriteString(strings.Repeat("0", -decpt))
			out.WriteString(digits)
		case decpt >= len(digits):
			out.WriteString(digits)
			out.WriteString(strings.Repeat("0", decpt-len(digits)))
			out.WriteString(".0")
		default:
			out.WriteString(digits[:decpt])
			out.WriteByte('.')
			out.WriteString(digits[decpt:])
		}
		return out.String()
	}
	out.WriteString(digits[:1])
	if len(digits) > 1 {
		out.WriteByte('.')
		out.WriteString(digits[1:])
	}
	out.WriteByte('e')
	if exp < 0 {
		out.WriteByte('-')
		exp = -exp
	} else {
		out.WriteByte('+')
	}
	if exp < 10 {
		out.WriteByte('0')
	}
	out.WriteString(strconv.Itoa(exp))
	return out.String()
}
