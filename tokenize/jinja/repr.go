package jinja

// Python's str() and repr() of template values.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
)

// jkStr is Python's str(v) (what {{ v }} prints).
func jStr(v jv) string {
	switch v.k {
	case jkStr:
		return v.s
	case jkUndef:
		return ""
	}
	var b strings.Builder
	jWriteStr(&b, v)
	return b.String()
}

func jWriteStr(b *strings.Builder, v jv) { jWriteStrD(b, v, 0) }

// jMaxReprDepth bounds printing of nested (possibly self-referencing namespace) values;
// Python would raise RecursionError, we print "...".
const jMaxReprDepth = 500

func jWriteStrD(b *strings.Builder, v jv, depth int) {
	if depth > jMaxReprDepth {
		b.WriteString("...")
		return
	}
	switch v.k {
	case jkStr:
		b.WriteString(v.s)
	case jkUndef:
	case jkNone:
		b.WriteString("None")
	case jkBool:
		if v.n != 0 {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case jkInt:
		var buf [24]byte
		b.Write(strconv.AppendInt(buf[:0], v.n, 10))
	case jkBig:
		b.WriteString(v.o.(*big.Int).String())
	case jkFloat:
		b.WriteString(jFloatRepr(v.f))
	case jkList, jkTuple, jkDict:
		jWriteReprD(b, v, depth+1)
	case jkNS:
		b.WriteString("<Namespace {")
		ns := v.o.(*jNamespace)
		for i, k := range ns.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			jWriteStrRepr(b, k)
			b.WriteString(": ")
			jWriteReprD(b, ns.vals[i], depth+1)
		}
		b.WriteString("}>")
	case jkFunc:
		c := v.o.(*jCallable)
		if c.macro != nil {
			b.WriteString("<Macro ")
			jWriteStrRepr(b, c.name)
			b.WriteString(">")
		} else {
			b.WriteString("<function ")
			b.WriteString(c.name)
			b.WriteString(">")
		}
	case jkGen:
		g := v.o.(*jGen)
		if g.name == "generator" {
			b.WriteString("<generator object " + g.fn + ">")
		} else {
			b.WriteString("<" + g.name + " object>")
		}
	case jkView:
		w := v.o.(*jView)
		b.WriteString(w.name + "([")
		for i, it := range w.items {
			if i > 0 {
				b.WriteString(", ")
			}
			jWriteReprD(b, it, depth+1)
		}
		b.WriteString("])")
	case jkLoop:
		l := v.o.(*jLoopCtx)
		b.WriteString("<LoopContext ")
		b.WriteString(strconv.Itoa(l.index0 + 1))
		b.WriteString("/")
		b.WriteString(strconv.Itoa(len(l.items)))
		b.WriteString(">")
	default:
		b.WriteString("<")
		b.WriteString(jValueTypeName(v))
		b.WriteString(" object>")
	}
}

// jRepr is Python's repr(v).
func jRepr(v jv) string {
	var b strings.Builder
	jWriteRepr(&b, v)
	return b.String()
}

func jWriteRepr(b *strings.Builder, v jv) { jWriteReprD(b, v, 0) }

func jWriteReprD(b *strings.Builder, v jv, depth int) {
	if depth > jMaxReprDepth {
		b.WriteString("...")
		return
	}
	switch v.k {
	case jkStr:
		jWriteStrRepr(b, v.s)
	case jkUndef:
		b.WriteString("Undefined")
	case jkList:
		b.WriteByte('[')
		for i, it := range v.list().items {
			if i > 0 {
				b.WriteString(", ")
			}
			jWriteReprD(b, it, depth+1)
		}
		b.WriteByte(']')
	case jkTuple:
		items := v.list().items
		b.WriteByte('(')
		for i, it := range items {
			if i > 0 {
				b.WriteString(", ")
			}
			jWriteReprD(b, it, depth+1)
		}
		if len(items) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case jkDict:
		d := v.dict()
		b.WriteByte('{')
		for i := range d.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			jWriteReprD(b, d.keys[i], depth+1)
			b.WriteString(": ")
			jWriteReprD(b, d.vals[i], depth+1)
		}
		b.WriteByte('}')
	default:
		jWriteStrD(b, v, depth)
	}
}

// jPyQuote is repr() of a str.
func jPyQuote(s string) string {
	var b strings.Builder
	jWriteStrRepr(&b, s)
	return b.String()
}

// jWriteStrRepr writes Python's repr of a str: single quotes unless the string contains
// a single quote and no double quote; non-printable characters escaped.
func jWriteStrRepr(b *strings.Builder, s string) {
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
			b.WriteString(jHex(uint32(r), 2))
		case r < 0x7f:
			b.WriteRune(r)
		case jPyPrintable(r):
			b.WriteRune(r)
		case r < 0x100:
			b.WriteString(`\x`)
			b.WriteString(jHex(uint32(r), 2))
		case r < 0x10000:
			b.WriteString(`\u`)
			b.WriteString(jHex(uint32(r), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(jHex(uint32(r), 8))
		}
	}
	b.WriteByte(quote)
}

// jPyPrintable approximates Python's str.isprintable for one character: everything but
// the Other and Separator categories, except the ASCII space.
func jPyPrintable(r rune) bool {
	if r == ' ' {
		return true
	}
	return unicode.IsPrint(r)
}

func jHex(v uint32, width int) string {
	s := strconv.FormatUint(uint64(v), 16)
	for len(s) < width {
		s = "0" + s
	}
	return s
}

// jFloatRepr is Python's repr(float): the shortest round-tripping digits, in fixed
// notation when the decimal exponent is in [-4, 16), with at least one fractional digit.
func jFloatRepr(f float64) string {
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
