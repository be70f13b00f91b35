package jinja

// Values model the Python objects a transformers chat template sees: None, bool, int
// (arbitrary precision), float, str, list, tuple, insertion-ordered dict, jinja2
// Undefined, Namespace, macros, loop contexts and callables. Lists, tuples and dicts are
// never mutated after construction (the ImmutableSandboxedEnvironment refuses every
// mutating method), so they are shared freely; only Namespace attributes change.

import (
	"iter"
	"math"
	"math/big"
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
	return &Error{Type: "UndefinedError", Message: jUndefMessage(v)}
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

// ---- the API of values ----

// Value is a template value. The zero Value is Undefined.
type Value = jv

// Kind is the kind of a Value: the Python type of the values callers build or decode.
// Inside a render values have other kinds too (tuples, namespaces, macros, ...).
type Kind = jKind

// The kinds of the values callers build or decode.
const (
	KindUndefined = jkUndef // jinja2's Undefined (a missing variable)
	KindNone      = jkNone
	KindBool      = jkBool
	KindInt       = jkInt // any size
	KindFloat     = jkFloat
	KindString    = jkStr
	KindList      = jkList
	KindDict      = jkDict
)

// NoneValue returns Python's None.
func NoneValue() Value { return jvNone }

// StringValue returns a str.
func StringValue(s string) Value { return jStrV(s) }

// BoolValue returns a bool.
func BoolValue(b bool) Value { return jBoolV(b) }

// ListValue returns a list of items; the list takes ownership of the slice.
func ListValue(items []Value) Value { return jListV(items) }

// DictValue returns a dict; d must not be changed afterwards.
func DictValue(d *Dict) Value { return jDictV(d) }

// Kind returns the kind of v.
func (v jv) Kind() Kind {
	if v.k == jkBig {
		return jkInt
	}
	return v.k
}

// String returns Python's str(v), what {{ v }} prints ("" for Undefined).
func (v jv) String() string { return jStr(v) }

// Repr returns Python's repr(v).
func (v jv) Repr() string { return jRepr(v) }

// Truth returns Python's bool(v).
func (v jv) Truth() bool { return jTruthy(v) }

// TypeName returns Python's type(v).__name__.
func (v jv) TypeName() string { return jValueTypeName(v) }

// Items returns the elements of a list, nil for other kinds. They must not be changed.
func (v jv) Items() []Value {
	if v.isSeq() {
		return v.list().items
	}
	return nil
}

// Dict returns the dict of a KindDict value, nil for other kinds.
func (v jv) Dict() *Dict {
	d, _ := v.o.(*jDict)
	return d
}

// Dict is an insertion-ordered dict. Build it with Set before it becomes part of a
// Value; templates never change it.
type Dict = jDict

// NewDict returns an empty dict with room for n items.
func NewDict(n int) *Dict { return jNewDict(n) }

// Len returns the number of items.
func (d *jDict) Len() int { return len(d.keys) }

// Get returns the value of the string key.
func (d *jDict) Get(key string) (Value, bool) { return d.getStr(key) }

// Set sets the string key to v; a key set again keeps its position.
func (d *jDict) Set(key string, v Value) { d.set(jStrV(key), v) }

// All returns an iterator over the items in order.
func (d *jDict) All() iter.Seq2[Value, Value] {
	return func(yield func(Value, Value) bool) {
		for i := range d.keys {
			if !yield(d.keys[i], d.vals[i]) {
				return
			}
		}
	}
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
var errNaNCompare = &Error{Type: "nan"}

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
