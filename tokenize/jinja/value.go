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

// Kind is the Python type of a Value. The exported kinds are those of the values callers
// build and decode; inside a render there are others (tuples, namespaces, macros, ...).
type Kind uint8

// The kinds of the values callers build and decode.
const (
	KindUndefined Kind = iota // jinja2's Undefined: a missing variable, attribute or item
	KindNone
	KindBool
	KindInt // of any size
	KindFloat
	KindString
	KindList
	KindDict
)

// The kinds only a render makes.
const (
	kindBig Kind = iota + KindDict + 1 // an int that does not fit in int64
	kindTuple
	kindNamespace
	kindFunc
	kindLoop
	kindCycler
	kindJoiner
	kindGenerator // a Python generator or iterator (consumed by iteration)
	kindView      // dict_keys / dict_values / dict_items
)

// Value is a template value: one of Python's objects as a template sees it. The zero
// Value is Undefined. Values are immutable once built (a Dict is filled before it
// becomes part of one) and safe to share between renders.
type Value struct {
	// Scalars live inline so that most values need no allocation: a bool or an int in
	// n, a float in f, a str in s; o holds a *big.Int (kindBig), a *list (KindList,
	// kindTuple), a *Dict, a *namespace, a *callable (kindFunc), a *loopContext,
	// *cyclerState, *joinerState, *generator or *dictView. For KindUndefined, s holds
	// the missing name (or the repr of a missing element), n packs the kind of the
	// object it was looked up on (+1, 0 = plain variable) and bit 8 marks an element
	// (non-string) lookup; o may hold a *undefinedHint with a fixed message.
	k Kind
	n int64
	f float64
	s string
	o any
}

type list struct{ items []Value }

// Dict is Python's dict: insertion-ordered, with Python's key equality (1 == 1.0 ==
// True). Fill it with Set before DictValue wraps it; templates never change it.
type Dict struct {
	keys []Value
	vals []Value
}

type namespace struct {
	keys []string
	vals []Value
}

// generator models the lazy objects jinja2 filters return (map, select, reject, selectattr,
// rejectattr, unique, batch, slice, items produce generators; reverse a reverse
// iterator): always true, no len(), not subscriptable, not JSON serialisable, and
// exhausted by the first iteration. The items are computed eagerly.
type generator struct {
	items []Value
	pos   int
	name  string // "generator", "list_reverseiterator", ...
	fn    string // for printing: "<generator object do_map ...>"
}

// dictView is a dict view (dict.keys(), dict.values(), dict.items()).
type dictView struct {
	items []Value
	name  string // dict_keys, dict_values or dict_items
}

func generatorValue(items []Value, fn string) Value {
	return Value{k: kindGenerator, o: &generator{items: items, name: "generator", fn: fn}}
}

type undefinedHint struct {
	msg      string
	security bool
}

var (
	undefinedValue = Value{k: KindUndefined}
	noneValue      = Value{k: KindNone}
	trueValue      = Value{k: KindBool, n: 1}
	falseValue     = Value{k: KindBool, n: 0}
	emptyString    = Value{k: KindString}
)

// StringValue returns a str.
func StringValue(s string) Value { return Value{k: KindString, s: s} }

// ListValue returns a list of items; the list takes ownership of the slice.
func ListValue(items []Value) Value { return Value{k: KindList, o: &list{items: items}} }

// DictValue returns a dict.
func DictValue(d *Dict) Value { return Value{k: KindDict, o: d} }

// NoneValue returns Python's None.
func NoneValue() Value { return noneValue }

func intValue(n int64) Value         { return Value{k: KindInt, n: n} }
func floatValue(f float64) Value     { return Value{k: KindFloat, f: f} }
func tupleValue(items []Value) Value { return Value{k: kindTuple, o: &list{items: items}} }

// BoolValue returns a bool.
func BoolValue(b bool) Value {
	if b {
		return trueValue
	}
	return falseValue
}

// bigValue returns an int value, normalised to KindInt when it fits.
func bigValue(b *big.Int) Value {
	if b.IsInt64() {
		return intValue(b.Int64())
	}
	return Value{k: kindBig, o: b}
}

// undefinedName is the Undefined of a missing variable.
func undefinedName(name string) Value { return Value{k: KindUndefined, s: name} }

// undefinedAttr is the Undefined of a missing attribute or key name on obj.
func undefinedAttr(obj Value, name string) Value {
	return Value{k: KindUndefined, s: name, n: int64(obj.k) + 1}
}

// undefinedElem is the Undefined of a missing element (non-string key) on obj.
func undefinedElem(obj Value, key Value) Value {
	return Value{k: KindUndefined, s: key.Repr(), n: int64(obj.k) + 1 | 1<<8}
}

// undefinedHinted is an Undefined with a fixed message (jinja2's undefined(hint=...)).
func undefinedHinted(msg string, security bool) Value {
	return Value{k: KindUndefined, o: &undefinedHint{msg: msg, security: security}}
}

func (v Value) list() *list { return v.o.(*list) }
func (v Value) dict() *Dict { return v.o.(*Dict) }
func (v Value) isSeq() bool { return v.k == KindList || v.k == kindTuple }
func (v Value) isNumber() bool {
	return v.k == KindBool || v.k == KindInt || v.k == kindBig || v.k == KindFloat
}
func (v Value) isInteger() bool { return v.k == KindBool || v.k == KindInt || v.k == kindBig }

// undefinedMessage is the text of the UndefinedError raised when an Undefined is used.
func undefinedMessage(v Value) string {
	if h, ok := v.o.(*undefinedHint); ok {
		return h.msg
	}
	if v.n == 0 {
		return pyQuote(v.s) + " is undefined"
	}
	objKind := Kind(v.n&0xff - 1)
	if v.n&(1<<8) != 0 {
		return objectTypeRepr(objKind) + " has no element " + v.s
	}
	return pyQuote(objectTypeRepr(objKind)) + " has no attribute " + pyQuote(v.s)
}

// undefinedError is the error raised when an Undefined is used in an operation.
func undefinedError(v Value) error {
	if h, ok := v.o.(*undefinedHint); ok && h.security {
		return errorf("SecurityError", "%s", h.msg)
	}
	return &Error{Type: "UndefinedError", Message: undefinedMessage(v)}
}

// objectTypeRepr mirrors jinja2.utils.object_type_repr.
func objectTypeRepr(k Kind) string {
	if k == KindNone {
		return "None"
	}
	return k.String() + " object"
}

// TypeName returns Python's type(v).__name__.
func (v Value) TypeName() string {
	switch v.k {
	case kindGenerator:
		return v.o.(*generator).name
	case kindView:
		return v.o.(*dictView).name
	case kindFunc:
		if c := v.o.(*callable); c.macro != nil {
			return "Macro"
		}
	}
	return v.k.String()
}

// String returns the Python type name of the kind, as error messages use it.
func (k Kind) String() string {
	switch k {
	case KindUndefined:
		return "Undefined"
	case KindNone:
		return "NoneType"
	case KindBool:
		return "bool"
	case KindInt, kindBig:
		return "int"
	case KindFloat:
		return "float"
	case KindString:
		return "str"
	case KindList:
		return "list"
	case kindTuple:
		return "tuple"
	case KindDict:
		return "dict"
	case kindNamespace:
		return "Namespace"
	case kindFunc:
		return "function"
	case kindLoop:
		return "LoopContext"
	case kindCycler:
		return "Cycler"
	case kindJoiner:
		return "Joiner"
	}
	return "object"
}

// ---- accessors ----

// Kind returns the kind of v (KindInt for an int of any size).
func (v Value) Kind() Kind {
	if v.k == kindBig {
		return KindInt
	}
	return v.k
}

// Items returns the elements of a list, nil for other kinds. They must not be changed.
func (v Value) Items() []Value {
	if v.isSeq() {
		return v.list().items
	}
	return nil
}

// Dict returns the dict of a KindDict value, nil for other kinds.
func (v Value) Dict() *Dict {
	d, _ := v.o.(*Dict)
	return d
}

// Len returns the number of items.
func (d *Dict) Len() int { return len(d.keys) }

// Set sets the string key to v; a key set again keeps its position.
func (d *Dict) Set(key string, v Value) { d.set(StringValue(key), v) }

// All returns an iterator over the items in order.
func (d *Dict) All() iter.Seq2[Value, Value] {
	return func(yield func(Value, Value) bool) {
		for i := range d.keys {
			if !yield(d.keys[i], d.vals[i]) {
				return
			}
		}
	}
}

// ---- dict ----

// NewDict returns an empty dict with room for n items.
func NewDict(n int) *Dict { return &Dict{keys: make([]Value, 0, n), vals: make([]Value, 0, n)} }

// get looks a key up with Python dict semantics (1 == 1.0 == True).
func (d *Dict) get(key Value) (Value, bool) {
	if key.k == KindString {
		for i := range d.keys {
			if d.keys[i].k == KindString && d.keys[i].s == key.s {
				return d.vals[i], true
			}
		}
		return Value{}, false
	}
	for i := range d.keys {
		if equal(d.keys[i], key) {
			return d.vals[i], true
		}
	}
	return Value{}, false
}

// Get returns the value of the string key.
func (d *Dict) Get(key string) (Value, bool) {
	for i := range d.keys {
		if d.keys[i].k == KindString && d.keys[i].s == key {
			return d.vals[i], true
		}
	}
	return Value{}, false
}

// set inserts or replaces a key; a replaced key keeps its position (Python dicts).
// Only used while building a dict that nothing else references yet.
func (d *Dict) set(key, val Value) {
	for i := range d.keys {
		if (key.k == KindString && d.keys[i].k == KindString && d.keys[i].s == key.s) || (key.k != KindString && equal(d.keys[i], key)) {
			d.vals[i] = val
			return
		}
	}
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, val)
}

func (d *Dict) copy() *Dict {
	return &Dict{keys: append([]Value(nil), d.keys...), vals: append([]Value(nil), d.vals...)}
}

// ---- namespace ----

func (ns *namespace) get(name string) (Value, bool) {
	for i, k := range ns.keys {
		if k == name {
			return ns.vals[i], true
		}
	}
	return Value{}, false
}

func (ns *namespace) set(name string, v Value) {
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

// Truth returns Python's bool(v).
func (v Value) Truth() bool {
	switch v.k {
	case KindUndefined, KindNone:
		return false
	case KindBool, KindInt:
		return v.n != 0
	case kindBig:
		return true
	case KindFloat:
		return v.f != 0
	case KindString:
		return v.s != ""
	case KindList, kindTuple:
		return len(v.list().items) > 0
	case KindDict:
		return len(v.dict().keys) > 0
	case kindView:
		return len(v.o.(*dictView).items) > 0
	}
	return true
}

func bigOf(v Value) *big.Int {
	if v.k == kindBig {
		return v.o.(*big.Int)
	}
	return big.NewInt(v.n)
}

// numCompare compares two numbers; ok is false when either is NaN.
func numCompare(a, b Value) (c int, ok bool) {
	if a.k == KindFloat || b.k == KindFloat {
		var x, y float64
		if a.k == KindFloat && b.k == KindFloat {
			x, y = a.f, b.f
		} else if a.k == KindFloat {
			if b.k == kindBig {
				return -bigFloatCompare(bigOf(b), a.f), !math.IsNaN(a.f)
			}
			x, y = a.f, float64(b.n)
			if math.IsNaN(x) {
				return 0, false
			}
			if !math.IsInf(x, 0) && (b.n > 1<<53 || b.n < -(1<<53)) {
				return -bigFloatCompare(big.NewInt(b.n), x), true
			}
		} else {
			if a.k == kindBig {
				return bigFloatCompare(bigOf(a), b.f), !math.IsNaN(b.f)
			}
			x, y = float64(a.n), b.f
			if math.IsNaN(y) {
				return 0, false
			}
			if !math.IsInf(y, 0) && (a.n > 1<<53 || a.n < -(1<<53)) {
				return bigFloatCompare(big.NewInt(a.n), y), true
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
	if a.k == kindBig || b.k == kindBig {
		return bigOf(a).Cmp(bigOf(b)), true
	}
	switch {
	case a.n < b.n:
		return -1, true
	case a.n > b.n:
		return 1, true
	}
	return 0, true
}

// bigFloatCompare compares an integer with a (non-NaN) float exactly.
func bigFloatCompare(i *big.Int, f float64) int {
	if math.IsInf(f, 1) {
		return -1
	}
	if math.IsInf(f, -1) {
		return 1
	}
	bf := new(big.Float).SetInt(i)
	return bf.Cmp(big.NewFloat(f))
}

// equal is Python's ==.
func equal(a, b Value) bool {
	if a.isNumber() && b.isNumber() {
		c, ok := numCompare(a, b)
		return ok && c == 0
	}
	if a.k != b.k {
		return false
	}
	switch a.k {
	case KindUndefined, KindNone:
		return true
	case KindString:
		return a.s == b.s
	case KindList, kindTuple:
		x, y := a.list().items, b.list().items
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case KindDict:
		x, y := a.dict(), b.dict()
		if len(x.keys) != len(y.keys) {
			return false
		}
		for i, k := range x.keys {
			w, ok := y.get(k)
			if !ok || !equal(x.vals[i], w) {
				return false
			}
		}
		return true
	}
	return a.o == b.o
}

// compare is Python's ordering (<, >, ...). It returns the sign of a-b.
func compare(op string, a, b Value) (int, error) {
	if a.k == KindUndefined {
		return 0, undefinedError(a)
	}
	if b.k == KindUndefined {
		return 0, undefinedError(b)
	}
	if a.isNumber() && b.isNumber() {
		c, ok := numCompare(a, b)
		if !ok {
			return 0, errNaNCompare
		}
		return c, nil
	}
	if a.k == KindString && b.k == KindString {
		return strings.Compare(a.s, b.s), nil // UTF-8 byte order == code point order
	}
	if (a.k == KindList && b.k == KindList) || (a.k == kindTuple && b.k == kindTuple) {
		x, y := a.list().items, b.list().items
		for i := 0; i < len(x) && i < len(y); i++ {
			if equal(x[i], y[i]) {
				continue
			}
			return compare(op, x[i], y[i])
		}
		switch {
		case len(x) < len(y):
			return -1, nil
		case len(x) > len(y):
			return 1, nil
		}
		return 0, nil
	}
	return 0, errorf("TypeError", "'%s' not supported between instances of '%s' and '%s'", op, a.TypeName(), b.TypeName())
}

// errNaNCompare marks a comparison involving NaN, which is false for every operator.
var errNaNCompare = &Error{Type: "nan"}

// ---- strings by code point ----

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// strLen is len(str): the number of code points.
func strLen(s string) int {
	if isASCII(s) {
		return len(s)
	}
	return utf8.RuneCountInString(s)
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || (r >= '\t' && r <= '\r') || (r >= 0x1c && r <= 0x1f)
	}
	return unicode.IsSpace(r)
}

func pyStrip(s string) string  { return strings.TrimFunc(s, pyIsSpace) }
func pyLStrip(s string) string { return strings.TrimLeftFunc(s, pyIsSpace) }
func pyRStrip(s string) string { return strings.TrimRightFunc(s, pyIsSpace) }

// ---- list helpers ----

// iterate returns the items a Python for loop over v would produce.
func iterate(v Value) ([]Value, error) {
	switch v.k {
	case KindList, kindTuple:
		return v.list().items, nil
	case KindDict:
		return v.dict().keys, nil
	case KindString:
		return strChars(v.s), nil
	case KindUndefined:
		return nil, nil
	case kindGenerator:
		g := v.o.(*generator)
		rest := g.items[g.pos:]
		g.pos = len(g.items)
		return rest, nil
	case kindView:
		return v.o.(*dictView).items, nil
	case kindNamespace:
		return nil, errorf("TypeError", "'Namespace' object is not iterable")
	}
	return nil, errorf("TypeError", "'%s' object is not iterable", v.TypeName())
}

func strChars(s string) []Value {
	out := make([]Value, 0, len(s))
	for i := 0; i < len(s); {
		_, size := utf8.DecodeRuneInString(s[i:])
		out = append(out, StringValue(s[i:i+size]))
		i += size
	}
	return out
}

// pyLen is Python's len(v).
func pyLen(v Value) (int, error) {
	switch v.k {
	case KindString:
		return strLen(v.s), nil
	case KindList, kindTuple:
		return len(v.list().items), nil
	case KindDict:
		return len(v.dict().keys), nil
	case KindUndefined:
		return 0, nil
	case kindNamespace:
		return len(v.o.(*namespace).keys), nil
	case kindLoop:
		return len(v.o.(*loopContext).items), nil
	case kindView:
		return len(v.o.(*dictView).items), nil
	}
	return 0, errorf("TypeError", "object of type '%s' has no len()", v.TypeName())
}

// hashable reports whether v can be a dict key.
func hashable(v Value) bool {
	switch v.k {
	case KindList, KindDict, kindNamespace:
		return false
	case kindTuple:
		for _, it := range v.list().items {
			if !hashable(it) {
				return false
			}
		}
	}
	return true
}
