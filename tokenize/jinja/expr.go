package jinja

// Expressions: evaluation, comparison and membership, attribute and item access as
// SandboxedEnvironment.getattr/getitem do, and slicing.

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"unicode/utf8"
)

func (e *evaluator) eval(x expr, s *scope) (Value, error) {
	switch t := x.(type) {
	case *constExpr:
		return t.v, nil
	case *nameExpr:
		if v, ok := s.lookup(t.name); ok {
			return v, nil
		}
		return undefinedName(t.name), nil
	case *getattrExpr:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return Value{}, err
		}
		return e.getattr(obj, t.name)
	case *getitemExpr:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return Value{}, err
		}
		if sl, ok := t.key.(*sliceExpr); ok {
			return e.slice(obj, sl, s)
		}
		key, err := e.eval(t.key, s)
		if err != nil {
			return Value{}, err
		}
		return e.getitem(obj, key)
	case *sliceExpr:
		return Value{}, errorf("TypeError", "slice is only valid as a subscript")
	case *callExpr:
		return e.evalCall(t, s)
	case *filterExpr:
		var v Value
		if t.e != nil {
			var err error
			if v, err = e.eval(t.e, s); err != nil {
				return Value{}, err
			}
		}
		return e.applyFilter(t, v, s)
	case *testExpr:
		v, err := e.eval(t.e, s)
		if err != nil {
			return Value{}, err
		}
		if t.fn == nil {
			return Value{}, errorf("TemplateRuntimeError", "No test named '%s' found.", t.name)
		}
		args, kw, err := e.evalArgs(&t.args, s)
		if err != nil {
			return Value{}, err
		}
		ok, err := t.fn(e, v, args, kw)
		if err != nil {
			return Value{}, err
		}
		return BoolValue(ok), nil
	case *notExpr:
		v, err := e.eval(t.e, s)
		if err != nil {
			return Value{}, err
		}
		if err := checkBool(v); err != nil {
			return Value{}, err
		}
		return BoolValue(!v.Truth()), nil
	case *negExpr:
		v, err := e.eval(t.e, s)
		if err != nil {
			return Value{}, err
		}
		return negate(v)
	case *posExpr:
		v, err := e.eval(t.e, s)
		if err != nil {
			return Value{}, err
		}
		return unaryPlus(v)
	case *binExpr:
		if t.op == "+" {
			v, _, err := e.addChain(t, s, false)
			return v, err
		}
		l, err := e.eval(t.l, s)
		if err != nil {
			return Value{}, err
		}
		r, err := e.eval(t.r, s)
		if err != nil {
			return Value{}, err
		}
		return binaryOp(t.op, l, r)
	case *andExpr:
		l, err := e.eval(t.l, s)
		if err != nil {
			return Value{}, err
		}
		if err := checkBool(l); err != nil {
			return Value{}, err
		}
		if !l.Truth() {
			return l, nil
		}
		return e.eval(t.r, s)
	case *orExpr:
		l, err := e.eval(t.l, s)
		if err != nil {
			return Value{}, err
		}
		if err := checkBool(l); err != nil {
			return Value{}, err
		}
		if l.Truth() {
			return l, nil
		}
		return e.eval(t.r, s)
	case *compareExpr:
		l, err := e.eval(t.first, s)
		if err != nil {
			return Value{}, err
		}
		for i, op := range t.ops {
			r, err := e.eval(t.rest[i], s)
			if err != nil {
				return Value{}, err
			}
			ok, err := compareOp(op, l, r)
			if err != nil {
				return Value{}, err
			}
			if !ok {
				return falseValue, nil
			}
			l = r
		}
		return trueValue, nil
	case *concatExpr:
		var b strings.Builder
		for _, a := range t.args {
			v, err := e.eval(a, s)
			if err != nil {
				return Value{}, err
			}
			writeStr(&b, v)
		}
		return StringValue(b.String()), nil
	case *condExpr:
		c, err := e.eval(t.test, s)
		if err != nil {
			return Value{}, err
		}
		if err := checkBool(c); err != nil {
			return Value{}, err
		}
		if c.Truth() {
			return e.eval(t.yes, s)
		}
		if t.no == nil {
			return undefinedHinted("the inline if-expression evaluated to false and no else section was defined.", false), nil
		}
		return e.eval(t.no, s)
	case *listExpr:
		items := make([]Value, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return Value{}, err
			}
			items[i] = v
		}
		return ListValue(items), nil
	case *tupleExpr:
		items := make([]Value, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return Value{}, err
			}
			items[i] = v
		}
		return tupleValue(items), nil
	case *dictExpr:
		d := NewDict(len(t.keys))
		for i := range t.keys {
			k, err := e.eval(t.keys[i], s)
			if err != nil {
				return Value{}, err
			}
			if !hashable(k) {
				return Value{}, errorf("TypeError", "unhashable type: '%s'", k.TypeName())
			}
			v, err := e.eval(t.vals[i], s)
			if err != nil {
				return Value{}, err
			}
			d.set(k, v)
		}
		return DictValue(d), nil
	}
	return Value{}, fmt.Errorf("internal: unknown expression %T", x)
}

func compareOp(op string, l, r Value) (bool, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in":
		return contains(r, l)
	case "notin":
		ok, err := contains(r, l)
		return !ok, err
	}
	c, err := compare(op, l, r)
	if err == errNaNCompare {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, fmt.Errorf("internal: operator %s", op)
}

// contains is Python's "item in container".
func contains(container, item Value) (bool, error) {
	switch container.k {
	case KindString:
		if item.k != KindString {
			return false, errorf("TypeError", "'in <string>' requires string as left operand, not %s", item.TypeName())
		}
		return strings.Contains(container.s, item.s), nil
	case KindList, kindTuple:
		for _, it := range container.list().items {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case KindDict:
		if !hashable(item) {
			return false, errorf("TypeError", "unhashable type: '%s'", item.TypeName())
		}
		_, ok := container.dict().get(item)
		return ok, nil
	case KindUndefined:
		return false, nil
	case kindGenerator:
		g := container.o.(*generator)
		for g.pos < len(g.items) {
			it := g.items[g.pos]
			g.pos++
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case kindView:
		w := container.o.(*dictView)
		if w.name == "dict_keys" && !hashable(item) {
			return false, errorf("TypeError", "unhashable type: '%s'", item.TypeName())
		}
		for _, it := range w.items {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case kindLoop:
		for _, it := range container.o.(*loopContext).items {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, errorf("TypeError", "argument of type '%s' is not iterable", container.TypeName())
}

// ---- attribute and item access (SandboxedEnvironment.getattr / getitem) ----

var dictMethods = map[string]bool{"get": true, "items": true, "keys": true, "values": true, "copy": true}
var dictUnsafe = map[string]bool{"clear": true, "pop": true, "popitem": true, "setdefault": true, "update": true}
var listMethods = map[string]bool{"count": true, "index": true, "copy": true}
var listUnsafe = map[string]bool{"append": true, "clear": true, "pop": true, "reverse": true, "insert": true, "sort": true, "extend": true, "remove": true}

// unsafeUndefined is the Undefined the sandbox returns for a mutating method.
func unsafeUndefined(obj Value, name string) Value {
	return undefinedHinted(fmt.Sprintf("access to attribute '%s' of '%s' object is unsafe.", name, obj.TypeName()), true)
}

// attribute returns Python getattr(obj, name) when obj has such an attribute.
func (e *evaluator) attribute(obj Value, name string) (Value, bool) {
	if strings.HasPrefix(name, "_") {
		if strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") && len(name) > 4 {
			return unsafeUndefined(obj, name), true
		}
		return Value{}, false
	}
	switch obj.k {
	case KindDict:
		if dictMethods[name] {
			return boundMethod(obj, name), true
		}
		if dictUnsafe[name] {
			return unsafeUndefined(obj, name), true
		}
	case KindList, kindTuple:
		if listMethods[name] && !(obj.k == kindTuple && name == "copy") {
			return boundMethod(obj, name), true
		}
		if obj.k == KindList && listUnsafe[name] {
			return unsafeUndefined(obj, name), true
		}
	case KindString:
		if strMethods[name] != nil {
			return boundMethod(obj, name), true
		}
	case kindNamespace:
		return obj.o.(*namespace).get(name)
	case kindLoop:
		return e.loopAttr(obj.o.(*loopContext), obj, name)
	case kindCycler:
		c := obj.o.(*cyclerState)
		switch name {
		case "current":
			return c.items[c.pos], true
		case "next", "reset":
			return boundMethod(obj, name), true
		}
	case kindFunc:
		c := obj.o.(*callable)
		if c.macro != nil {
			switch name {
			case "name":
				return StringValue(c.macro.name), true
			case "arguments":
				items := make([]Value, len(c.macro.params))
				for i, p := range c.macro.params {
					items[i] = StringValue(p)
				}
				return tupleValue(items), true
			case "catch_kwargs":
				return BoolValue(c.macro.catchKwargs), true
			case "catch_varargs":
				return BoolValue(c.macro.catchVarargs), true
			case "caller":
				return BoolValue(c.macro.usesCaller), true
			}
		}
	case KindFloat:
		switch name {
		case "real":
			return obj, true
		case "imag":
			return floatValue(0), true
		case "is_integer", "hex", "conjugate", "as_integer_ratio":
			return boundMethod(obj, name), true
		}
	case KindInt, kindBig, KindBool:
		switch name {
		case "real", "numerator":
			if obj.k == KindBool {
				return intValue(obj.n), true
			}
			return obj, true
		case "imag":
			return intValue(0), true
		case "denominator":
			return intValue(1), true
		case "bit_length", "conjugate":
			return boundMethod(obj, name), true
		}
	}
	return Value{}, false
}

func boundMethod(obj Value, name string) Value {
	return Value{k: kindFunc, o: &callable{name: obj.TypeName() + "." + name, recv: obj, method: name}}
}

// getattr is obj.name: the attribute, else the item, else Undefined.
func (e *evaluator) getattr(obj Value, name string) (Value, error) {
	if obj.k == KindUndefined {
		return Value{}, undefinedError(obj)
	}
	if obj.k == KindDict {
		// fast path for the common message.role / tool.function lookups
		if !dictMethods[name] && !dictUnsafe[name] && !strings.HasPrefix(name, "__") {
			if v, ok := obj.dict().Get(name); ok {
				return v, nil
			}
			return undefinedAttr(obj, name), nil
		}
	}
	if v, ok := e.attribute(obj, name); ok {
		return v, nil
	}
	switch obj.k {
	case KindDict:
		if v, ok := obj.dict().Get(name); ok {
			return v, nil
		}
	}
	return undefinedAttr(obj, name), nil
}

// getitem is obj[key]: the item, else (for string keys) the attribute, else Undefined.
func (e *evaluator) getitem(obj Value, key Value) (Value, error) {
	switch obj.k {
	case KindUndefined:
		return Value{}, undefinedError(obj)
	case KindDict:
		if hashable(key) {
			if v, ok := obj.dict().get(key); ok {
				return v, nil
			}
		}
	case KindList, kindTuple, KindString:
		if key.k == KindInt || key.k == KindBool || key.k == kindBig {
			n := 0
			if obj.k == KindString {
				n = strLen(obj.s)
			} else {
				n = len(obj.list().items)
			}
			if key.k != kindBig {
				i := key.n
				if i < 0 {
					i += int64(n)
				}
				if i >= 0 && i < int64(n) {
					if obj.k == KindString {
						return StringValue(runeAt(obj.s, int(i))), nil
					}
					return obj.list().items[i], nil
				}
			}
			return undefinedElem(obj, key), nil
		}
	case kindLoop, kindNamespace, kindCycler:
	}
	if key.k == KindString {
		if v, ok := e.attribute(obj, key.s); ok {
			return v, nil
		}
		return undefinedAttr(obj, key.s), nil
	}
	return undefinedElem(obj, key), nil
}

// runeAt returns the i-th code point of s as a string.
func runeAt(s string, i int) string {
	if isASCII(s) {
		return s[i : i+1]
	}
	for pos := range s {
		if i == 0 {
			_, size := utf8.DecodeRuneInString(s[pos:])
			return s[pos : pos+size]
		}
		i--
	}
	return ""
}

func (e *evaluator) slice(obj Value, sl *sliceExpr, s *scope) (Value, error) {
	var bounds [3]Value
	for i, x := range []expr{sl.start, sl.stop, sl.step} {
		if x == nil {
			bounds[i] = noneValue
			continue
		}
		v, err := e.eval(x, s)
		if err != nil {
			return Value{}, err
		}
		bounds[i] = v
	}
	switch obj.k {
	case KindUndefined:
		return Value{}, undefinedError(obj)
	case KindList, kindTuple, KindString:
	default:
		return undefinedElem(obj, noneValue), nil
	}
	var n int
	var runes []rune
	if obj.k == KindString {
		if isASCII(obj.s) {
			n = len(obj.s)
		} else {
			runes = []rune(obj.s)
			n = len(runes)
		}
	} else {
		n = len(obj.list().items)
	}
	idx := make([]int64, 3)
	for i, b := range bounds {
		switch b.k {
		case KindNone:
			idx[i] = math.MinInt64
		case KindInt, KindBool:
			idx[i] = b.n
		case kindBig:
			if b.o.(*big.Int).Sign() > 0 {
				idx[i] = math.MaxInt64 / 2
			} else {
				idx[i] = -math.MaxInt64 / 2
			}
		case KindUndefined:
			return Value{}, undefinedError(b)
		default:
			return Value{}, errorf("TypeError", "slice indices must be integers or None or have an __index__ method")
		}
	}
	start, stop, step, err := sliceIndices(idx[0], idx[1], idx[2], n)
	if err != nil {
		return Value{}, err
	}
	switch obj.k {
	case KindString:
		if runes == nil && step == 1 {
			if stop < start {
				return emptyString, nil
			}
			return StringValue(obj.s[start:stop]), nil
		}
		if runes == nil {
			runes = []rune(obj.s)
		}
		var b strings.Builder
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			b.WriteRune(runes[i])
		}
		return StringValue(b.String()), nil
	default:
		src := obj.list().items
		var out []Value
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			out = append(out, src[i])
		}
		if obj.k == kindTuple {
			return tupleValue(out), nil
		}
		return ListValue(out), nil
	}
}

// sliceIndices is slice.indices(n); absent bounds are math.MinInt64.
func sliceIndices(start, stop, step int64, n int) (int, int, int, error) {
	st := int64(1)
	if step != math.MinInt64 {
		st = step
	}
	if st == 0 {
		return 0, 0, 0, errorf("ValueError", "slice step cannot be zero")
	}
	ln := int64(n)
	clamp := func(v int64, def int64) int64 {
		if v == math.MinInt64 {
			return def
		}
		if v < 0 {
			v += ln
			if v < 0 {
				if st < 0 {
					return -1
				}
				return 0
			}
		} else if v >= ln {
			if st < 0 {
				return ln - 1
			}
			return ln
		}
		return v
	}
	var s, e int64
	if st > 0 {
		s, e = clamp(start, 0), clamp(stop, ln)
	} else {
		s, e = clamp(start, ln-1), clamp(stop, -1)
	}
	return int(s), int(e), int(st), nil
}
