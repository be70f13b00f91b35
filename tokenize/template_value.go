package tokenize

// Values of the chat-template interpreter (see template.go for why kvgate has its own
// Jinja interpreter). They model the Python objects a transformers chat template sees:
// None, bool, int (arbitrary precision), float, str, list, tuple, insertion-ordered dict,
// jinja2 Undefined, Namespace, macros, loop contexts and callables. Lists, tuples and
// dicts are never mutated after construction (the ImmutableSandboxedEnvironment refuses
// every mutating method), so they are shared freely; only Namespace attributes change.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

type jKind uint8

const (
	jkUndef jKind = iota // jinja2.Undefined
	jkNone
	jkBool
	jkInt   // n
	jkBig   // o.(*big.Int), only when the value does not fit in int64
	jkFloat // f
	jkStr   // s
	jkList  // o.(*jList)
	jkTuple // o.(*jList)
	jkDict  // o.(*jDict)
	jkNS    // o.(*jNamespace)
	jkFunc  // o.(*jCallable)
	jkLoop  // o.(*jLoopCtx)
	jkCycler
	jkJoiner
	jkGen  // o.(*jGen): a Python generator or iterator (consumed by iteration)
	jkView // o.(*jView): dict_keys / dict_values / dict_items
)

// jv is one template value. Scalars live inline so that most values need no allocation.
// For jkUndef, s holds the missing name (or the repr of a missing element), n packs the
// kind of the object it was looked up on (+1, 0 = plain variable) and bit 8 marks an
// element (non-string) lookup; o may hold a *jUndefHint with a fixed message.
type jv struct {
	k jKind
	n int64
	f float64
	s string
	o any
}

type jList struct{ items []jv }

type jDict struct {
	keys []jv
	vals []jv
}

type jNamespace struct {
	keys []string
	vals []jv
}

// jGen models the lazy objects jinja2 filters return (map, select, reject, selectattr,
// rejectattr, unique, batch, slice, items produce generators; reverse a reverse
// iterator): always true, no len(), not subscriptable, not JSON serialisable, and
// exhausted by the first iteration. The items are computed eagerly.
type jGen struct {
	items []jv
	pos   int
	name  string // "generator", "list_reverseiterator", ...
	fn    string // for printing: "<generator object do_map ...>"
}

// jView is a dict view (dict.keys(), dict.values(), dict.items()).
type jView struct {
	items []jv
	name  string // dict_keys, dict_values or dict_items
}

func jGenV(items []jv, fn string) jv {
	return jv{k: jkGen, o: &jGen{items: items, name: "generator", fn: fn}}
}

type jUndefHint struct {
	msg      string
	security bool
}

var (
	jvUndefined = jv{k: jkUndef}
	jvNone      = jv{k: jkNone}
	jvTrue      = jv{k: jkBool, n: 1}
	jvFalse     = jv{k: jkBool, n: 0}
	jvEmptyStr  = jv{k: jkStr}
)

func jStrV(s string) jv     { return jv{k: jkStr, s: s} }
func jIntV(n int64) jv      { return jv{k: jkInt, n: n} }
func jFloatV(f float64) jv  { return jv{k: jkFloat, f: f} }
func jListV(items []jv) jv  { return jv{k: jkList, o: &jList{items: items}} }
func jTupleV(items []jv) jv { return jv{k: jkTuple, o: &jList{items: items}} }
func jDictV(d *jDict) jv    { return jv{k: jkDict, o: d} }

func jBoolV(b bool) jv {
	if b {
		return jvTrue
	}
	return jvFalse
}

// jBigV returns an int value, normalised to jkInt when it fits.
func jBigV(b *big.Int) jv {
	if b.IsInt64() {
		return jIntV(b.Int64())
	}
	return jv{k: jkBig, o: b}
}

// jUndefName is the Undefined of a missing variable.
func jUndefName(name string) jv { return jv{k: jkUndef, s: name} }

// jUndefAttr is the Undefined of a missing attribute or key name on obj.
func jUndefAttr(obj jv, name string) jv {
	return jv{k: jkUndef, s: name, n: int64(obj.k) + 1}
}

// jUndefElem is the Undefined of a missing element (non-string key) on obj.
func jUndefElem(obj jv, key jv) jv {
	return jv{k: jkUndef, s: jRepr(key), n: int64(obj.k) + 1 | 1<<8}
}

// jUndefHinted is an Undefined with a fixed message (jinja2's undefined(hint=...)).
func jUndefHinted(msg string, security bool) jv {
	return jv{k: jkUndef, o: &jUndefHint{msg: msg, security: security}}
}

func (v jv) list() *jList    { return v.o.(*jList) }
func (v jv) dict() *jDict    { return v.o.(*jDict) }
func (v jv) isSeq() bool     { return v.k == jkList || v.k == jkTuple }
func (v jv) isNumber() bool  { return v.k == jkBool || v.k == jkInt || v.k == jkBig || v.k == jkFloat }
func (v jv) isInteger() bool { return v.k == jkBool || v.k == jkInt || v.k == jkBig }

// jUndefMessage is the text of the UndefinedError raised when an Undefined is used.
func jUndefMessage(v jv) string {
	if h, ok := v.o.(*jUndefHint); ok {
		return h.msg
	}
	if v.n == 0 {
		return jPyQuote(v.s) + " is undefined"
	}
	objKind := jKind(v.n&0xff - 1)
	if v.n&(1<<8) != 0 {
		return jObjectTypeRepr(objKind) + " has no element " + v.s
	}
	return jPyQuote(jObjectTypeRepr(objKind)) + " has no attribute " + jPyQuote(v.s)
}

// jUndefError is the error raised when an Undefined is used in an operation.
func jUndefError(v jv) error {
	if h, ok := v.o.(*jUndefHint); ok && h.security {
		return jErrorf("SecurityError", "%s", h.msg)
	}
	return &jError{kind: "UndefinedError", msg: jUndefMessage(v)}
}

// jObjectTypeRepr mirrors jinja2.utils.object_type_repr.
func jObjectTypeRepr(k jKind) string {
	if k == jkNone {
		return "None"
	}
	return jTypeName(k) + " object"
}

// jValueTypeName is type(v).__name__.
func jValueTypeName(v jv) string {
	switch v.k {
	case jkGen:
		return v.o.(*jGen).name
	case jkView:
		return v.o.(*jView).name
	case jkFunc:
		if c := v.o.(*jCallable); c.macro != nil {
			return "Macro"
		}
	}
	return jTypeName(v.k)
}

// jTypeName is the Python type name of a kind, as used in error messages.
func jTypeName(k jKind) string {
	switch k {
	case jkUndef:
		return "Undefined"
	case jkNone:
		return "NoneType"
	case jkBool:
		return "bool"
	case jkInt, jkBig:
		return "int"
	case jkFloat:
		return "float"
	case jkStr:
		return "str"
	case jkList:
		return "list"
	case jkTuple:
		return "tuple"
	case jkDict:
		return "dict"
	case jkNS:
		return "Namespace"
	case jkFunc:
		return "function"
	case jkLoop:
		return "LoopContext"
	case jkCycler:
		return "Cycler"
	case jkJoiner:
		return "Joiner"
	}
	return "object"
}

// ---- dict ----

func jNewDict(n int) *jDict { return &jDict{keys: make([]jv, 0, n), vals: make([]jv, 0, n)} }

// get looks a key up with Python dict semantics (1 == 1.0 == True).
func (d *jDict) get(key jv) (jv, bool) {
	if key.k == jkStr {
		for i := range d.keys {
			if d.keys[i].k == jkStr && d.keys[i].s == key.s {
				return d.vals[i], true
			}
		}
		return jv{}, false
	}
	for i := range d.keys {
		if jEqual(d.keys[i], key) {
			return d.vals[i], true
		}
	}
	return jv{}, false
}

func (d *jDict) getStr(key string) (jv, bool) {
	for i := range d.keys {
		if d.keys[i].k == jkStr && d.keys[i].s == key {
			return d.vals[i], true
		}
	}
	return jv{}, false
}

// set inserts or replaces a key; a replaced key keeps its position (Python dicts).
// Only used while building a dict that nothing else references yet.
func (d *jDict) set(key, val jv) {
	for i := range d.keys {
		if (key.k == jkStr && d.keys[i].k == jkStr && d.keys[i].s == key.s) || (key.k != jkStr && jEqual(d.keys[i], key)) {
			d.vals[i] = val
			return
		}
	}
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, val)
}

// appendNew appends a key known not to be present.
func (d *jDict) appendNew(key string, val jv) {
	d.keys = append(d.keys, jStrV(key))
	d.vals = append(d.vals, val)
}

func (d *jDict) copy() *jDict {
	return &jDict{keys: append([]jv(nil), d.keys...), vals: append([]jv(nil), d.vals...)}
}

// ---- namespace ----

func (ns *jNamespace) get(name string) (jv, bool) {
	for i, k := range ns.keys {
		if k == name {
			return ns.vals[i], true
		}
	}
	return jv{}, false
}

func (ns *jNamespace) set(name string, v jv) {
	for i, k := range ns.keys {
		if k == name {
			ns.vals[i] = v
			return
		}
	}
	ns.keys = append(ns.keys, name)
	ns.vals = append(ns.vals, v)
}

// ---- truthiness, equality, ordering ----

// jTruthy is Python's bool(v).
func jTruthy(v jv) bool {
	switch v.k {
	case jkUndef, jkNone:
		return false
	case jkBool, jkInt:
		return v.n != 0
	case jkBig:
		return true
	case jkFloat:
		return v.f != 0
	case jkStr:
		return v.s != ""
	case jkList, jkTuple:
		return len(v.list().items) > 0
	case jkDict:
		return len(v.dict().keys) > 0
	case jkView:
		return len(v.o.(*jView).items) > 0
	}
	return true
}

func jBigOf(v jv) *big.Int {
	if v.k == jkBig {
		return v.o.(*big.Int)
	}
	return big.NewInt(v.n)
}

// jNumCompare compares two numbers; ok is false when either is NaN.
func jNumCompare(a, b jv) (c int, ok bool) {
	if a.k == jkFloat || b.k == jkFloat {
		var x, y float64
		if a.k == jkFloat && b.k == jkFloat {
			x, y = a.f, b.f
		} else if a.k == jkFloat {
			if b.k == jkBig {
				return -jBigFloatCompare(jBigOf(b), a.f), !math.IsNaN(a.f)
			}
			x, y = a.f, float64(b.n)
			if math.IsNaN(x) {
				return 0, false
			}
			if !math.IsInf(x, 0) && (b.n > 1<<53 || b.n < -(1<<53)) {
				return -jBigFloatCompare(big.NewInt(b.n), x), true
			}
		} else {
			if a.k == jkBig {
				return jBigFloatCompare(jBigOf(a), b.f), !math.IsNaN(b.f)
			}
			x, y = float64(a.n), b.f
			if math.IsNaN(y) {
				return 0, false
			}
			if !math.IsInf(y, 0) && (a.n > 1<<53 || a.n < -(1<<53)) {
				return jBigFloatCompare(big.NewInt(a.n), y), true
			}
		}
		if math.IsNaN(x) || math.IsNaN(y) {
			return 0, false
		}
		switch {
		case x < y:
			return -1, true
		case x > y:
			return 1, true
		}
		return 0, true
	}
	if a.k == jkBig || b.k == jkBig {
		return jBigOf(a).Cmp(jBigOf(b)), true
	}
	switch {
	case a.n < b.n:
		return -1, true
	case a.n > b.n:
		return 1, true
	}
	return 0, true
}

// jBigFloatCompare compares an integer with a (non-NaN) float exactly.
func jBigFloatCompare(i *big.Int, f float64) int {
	if math.IsInf(f, 1) {
		return -1
	}
	if math.IsInf(f, -1) {
		return 1
	}
	bf := new(big.Float).SetInt(i)
	return bf.Cmp(big.NewFloat(f))
}

// jEqual is Python's ==.
func jEqual(a, b jv) bool {
	if a.isNumber() && b.isNumber() {
		c, ok := jNumCompare(a, b)
		return ok && c == 0
	}
	if a.k != b.k {
		return false
	}
	switch a.k {
	case jkUndef, jkNone:
		return true
	case jkStr:
		return a.s == b.s
	case jkList, jkTuple:
		x, y := a.list().items, b.list().items
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case jkDict:
		x, y := a.dict(), b.dict()
		if len(x.keys) != len(y.keys) {
			return false
		}
		for i, k := range x.keys {
			w, ok := y.get(k)
			if !ok || !jEqual(x.vals[i], w) {
				return false
			}
		}
		return true
	}
	return a.o == b.o
}

// jCompare is Python's ordering (<, >, ...). It returns the sign of a-b.
func jCompare(op string, a, b jv) (int, error) {
	if a.k == jkUndef {
		return 0, jUndefError(a)
	}
	if b.k == jkUndef {
		return 0, jUndefError(b)
	}
	if a.isNumber() && b.isNumber() {
		c, ok := jNumCompare(a, b)
		if !ok {
			return 0, errNaNCompare
		}
		return c, nil
	}
	if a.k == jkStr && b.k == jkStr {
		return strings.Compare(a.s, b.s), nil // UTF-8 byte order == code point order
	}
	if (a.k == jkList && b.k == jkList) || (a.k == jkTuple && b.k == jkTuple) {
		x, y := a.list().items, b.list().items
		for i := 0; i < len(x) && i < len(y); i++ {
			if jEqual(x[i], y[i]) {
				continue
			}
			return jCompare(op, x[i], y[i])
		}
		switch {
		case len(x) < len(y):
			return -1, nil
		case len(x) > len(y):
			return 1, nil
		}
		return 0, nil
	}
	return 0, jErrorf("TypeError", "'%s' not supported between instances of '%s' and '%s'", op, jValueTypeName(a), jValueTypeName(b))
}

// errNaNCompare marks a comparison involving NaN, which is false for every operator.
var errNaNCompare = &jError{kind: "nan"}

// ---- str() and repr() ----

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

// ---- strings by code point ----

func jIsASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// jStrLen is len(str): the number of code points.
func jStrLen(s string) int {
	if jIsASCII(s) {
		return len(s)
	}
	return utf8.RuneCountInString(s)
}

// jPyIsSpace is Python's str.isspace for one character.
func jPyIsSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || (r >= '\t' && r <= '\r') || (r >= 0x1c && r <= 0x1f)
	}
	return unicode.IsSpace(r)
}

func jPyStrip(s string) string  { return strings.TrimFunc(s, jPyIsSpace) }
func jPyLStrip(s string) string { return strings.TrimLeftFunc(s, jPyIsSpace) }
func jPyRStrip(s string) string { return strings.TrimRightFunc(s, jPyIsSpace) }

// ---- list helpers ----

// jIterate returns the items a Python for loop over v would produce.
func jIterate(v jv) ([]jv, error) {
	switch v.k {
	case jkList, jkTuple:
		return v.list().items, nil
	case jkDict:
		return v.dict().keys, nil
	case jkStr:
		return jStrChars(v.s), nil
	case jkUndef:
		return nil, nil
	case jkGen:
		g := v.o.(*jGen)
		rest := g.items[g.pos:]
		g.pos = len(g.items)
		return rest, nil
	case jkView:
		return v.o.(*jView).items, nil
	case jkNS:
		return nil, jErrorf("TypeError", "'Namespace' object is not iterable")
	}
	return nil, jErrorf("TypeError", "'%s' object is not iterable", jValueTypeName(v))
}

func jStrChars(s string) []jv {
	out := make([]jv, 0, len(s))
	for i := 0; i < len(s); {
		_, size := utf8.DecodeRuneInString(s[i:])
		out = append(out, jStrV(s[i:i+size]))
		i += size
	}
	return out
}

// jLen is Python's len(v).
func jLen(v jv) (int, error) {
	switch v.k {
	case jkStr:
		return jStrLen(v.s), nil
	case jkList, jkTuple:
		return len(v.list().items), nil
	case jkDict:
		return len(v.dict().keys), nil
	case jkUndef:
		return 0, nil
	case jkNS:
		return len(v.o.(*jNamespace).keys), nil
	case jkLoop:
		return len(v.o.(*jLoopCtx).items), nil
	case jkView:
		return len(v.o.(*jView).items), nil
	}
	return 0, jErrorf("TypeError", "object of type '%s' has no len()", jValueTypeName(v))
}

// jHashable reports whether v can be a dict key.
func jHashable(v jv) bool {
	switch v.k {
	case jkList, jkDict, jkNS:
		return false
	case jkTuple:
		for _, it := range v.list().items {
			if !jHashable(it) {
				return false
			}
		}
	}
	return true
}
