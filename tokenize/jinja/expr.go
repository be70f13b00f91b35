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

func (e *jEval) eval(x jExpr, s *jScope) (jv, error) {
	switch t := x.(type) {
	case *jeConst:
		return t.v, nil
	case *jeName:
		if v, ok := s.lookup(t.name); ok {
			return v, nil
		}
		return jUndefName(t.name), nil
	case *jeGetattr:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return jv{}, err
		}
		return e.getattr(obj, t.name)
	case *jeGetitem:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return jv{}, err
		}
		if sl, ok := t.key.(*jeSlice); ok {
			return e.slice(obj, sl, s)
		}
		key, err := e.eval(t.key, s)
		if err != nil {
			return jv{}, err
		}
		return e.getitem(obj, key)
	case *jeSlice:
		return jv{}, jErrorf("TypeError", "slice is only valid as a subscript")
	case *jeCall:
		return e.evalCall(t, s)
	case *jeFilter:
		var v jv
		if t.e != nil {
			var err error
			if v, err = e.eval(t.e, s); err != nil {
				return jv{}, err
			}
		}
		return e.applyFilter(t, v, s)
	case *jeTest:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		if t.fn == nil {
			return jv{}, jErrorf("TemplateRuntimeError", "No test named '%s' found.", t.name)
		}
		args, kw, err := e.evalArgs(&t.args, s)
		if err != nil {
			return jv{}, err
		}
		ok, err := t.fn(e, v, args, kw)
		if err != nil {
			return jv{}, err
		}
		return jBoolV(ok), nil
	case *jeNot:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(v); err != nil {
			return jv{}, err
		}
		return jBoolV(!jTruthy(v)), nil
	case *jeNeg:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		return jNeg(v)
	case *jePos:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		return jPos(v)
	case *jeBin:
		if t.op == "+" {
			v, _, err := e.addChain(t, s, false)
			return v, err
		}
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		r, err := e.eval(t.r, s)
		if err != nil {
			return jv{}, err
		}
		return jBinary(t.op, l, r)
	case *jeAnd:
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(l); err != nil {
			return jv{}, err
		}
		if !jTruthy(l) {
			return l, nil
		}
		return e.eval(t.r, s)
	case *jeOr:
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(l); err != nil {
			return jv{}, err
		}
		if jTruthy(l) {
			return l, nil
		}
		return e.eval(t.r, s)
	case *jeCompare:
		l, err := e.eval(t.first, s)
		if err != nil {
			return jv{}, err
		}
		for i, op := range t.ops {
			r, err := e.eval(t.rest[i], s)
			if err != nil {
				return jv{}, err
			}
			ok, err := jCompareOp(op, l, r)
			if err != nil {
				return jv{}, err
			}
			if !ok {
				return jvFalse, nil
			}
			l = r
		}
		return jvTrue, nil
	case *jeConcat:
		var b strings.Builder
		for _, a := range t.args {
			v, err := e.eval(a, s)
			if err != nil {
				return jv{}, err
			}
			jWriteStr(&b, v)
		}
		return jStrV(b.String()), nil
	case *jeCond:
		c, err := e.eval(t.test, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(c); err != nil {
			return jv{}, err
		}
		if jTruthy(c) {
			return e.eval(t.yes, s)
		}
		if t.no == nil {
			return jUndefHinted("the inline if-expression evaluated to false and no else section was defined.", false), nil
		}
		return e.eval(t.no, s)
	case *jeList:
		items := make([]jv, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return jv{}, err
			}
			items[i] = v
		}
		return jListV(items), nil
	case *jeTuple:
		items := make([]jv, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return jv{}, err
			}
			items[i] = v
		}
		return jTupleV(items), nil
	case *jeDict:
		d := jNewDict(len(t.keys))
		for i := range t.keys {
			k, err := e.eval(t.keys[i], s)
			if err != nil {
				return jv{}, err
			}
			if !jHashable(k) {
				return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(k))
			}
			v, err := e.eval(t.vals[i], s)
			if err != nil {
				return jv{}, err
			}
			d.set(k, v)
		}
		return jDictV(d), nil
	}
	return jv{}, fmt.Errorf("internal: unknown expression %T", x)
}

func jCompareOp(op string, l, r jv) (bool, error) {
	switch op {
	case "==":
		return jEqual(l, r), nil
	case "!=":
		return !jEqual(l, r), nil
	case "in":
		return jContains(r, l)
	case "notin":
		ok, err := jContains(r, l)
		return !ok, err
	}
	c, err := jCompare(op, l, r)
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

// jContains is Python's "item in container".
func jContains(container, item jv) (bool, error) {
	switch container.k {
	case jkStr:
		if item.k != jkStr {
			return false, jErrorf("TypeError", "'in <string>' requires string as left operand, not %s", jValueTypeName(item))
		}
		return strings.Contains(container.s, item.s), nil
	case jkList, jkTuple:
		for _, it := range container.list().items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkDict:
		if !jHashable(item) {
			return false, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(item))
		}
		_, ok := container.dict().get(item)
		return ok, nil
	case jkUndef:
		return false, nil
	case jkGen:
		g := container.o.(*jGen)
		for g.pos < len(g.items) {
			it := g.items[g.pos]
			g.pos++
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkView:
		w := container.o.(*jView)
		if w.name == "dict_keys" && !jHashable(item) {
			return false, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(item))
		}
		for _, it := range w.items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkLoop:
		for _, it := range container.o.(*jLoopCtx).items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, jErrorf("TypeError", "argument of type '%s' is not iterable", jValueTypeName(container))
}

// ---- attribute and item access (SandboxedEnvironment.getattr / getitem) ----

var jDictMethods = map[string]bool{"get": true, "items": true, "keys": true, "values": true, "copy": true}
var jDictUnsafe = map[string]bool{"clear": true, "pop": true, "popitem": true, "setdefault": true, "update": true}
var jListMethods = map[string]bool{"count": true, "index": true, "copy": true}
var jListUnsafe = map[string]bool{"append": true, "clear": true, "pop": true, "reverse": true, "insert": true, "sort": true, "extend": true, "remove": true}

// jUnsafe is the Undefined the sandbox returns for a mutating method.
func jUnsafe(obj jv, name string) jv {
	return jUndefHinted(fmt.Sprintf("access to attribute '%s' of '%s' object is unsafe.", name, jValueTypeName(obj)), true)
}

// attribute returns Python getattr(obj, name) when obj has such an attribute.
func (e *jEval) attribute(obj jv, name string) (jv, bool) {
	if strings.HasPrefix(name, "_") {
		if strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") && len(name) > 4 {
			return jUnsafe(obj, name), true
		}
		return jv{}, false
	}
	switch obj.k {
	case jkDict:
		if jDictMethods[name] {
			return jBoundMethod(obj, name), true
		}
		if jDictUnsafe[name] {
			return jUnsafe(obj, name), true
		}
	case jkList, jkTuple:
		if jListMethods[name] && !(obj.k == jkTuple && name == "copy") {
			return jBoundMethod(obj, name), true
		}
		if obj.k == jkList && jListUnsafe[name] {
			return jUnsafe(obj, name), true
		}
	case jkStr:
		if jStrMethods[name] != nil {
			return jBoundMethod(obj, name), true
		}
	case jkNS:
		return obj.o.(*jNamespace).get(name)
	case jkLoop:
		return e.loopAttr(obj.o.(*jLoopCtx), obj, name)
	case jkCycler:
		c := obj.o.(*jCyclerState)
		switch name {
		case "current":
			return c.items[c.pos], true
		case "next", "reset":
			return jBoundMethod(obj, name), true
		}
	case jkFunc:
		c := obj.o.(*jCallable)
		if c.macro != nil {
			switch name {
			case "name":
				return jStrV(c.macro.name), true
			case "arguments":
				items := make([]jv, len(c.macro.params))
				for i, p := range c.macro.params {
					items[i] = jStrV(p)
				}
				return jTupleV(items), true
			case "catch_kwargs":
				return jBoolV(c.macro.catchKwargs), true
			case "catch_varargs":
				return jBoolV(c.macro.catchVarargs), true
			case "caller":
				return jBoolV(c.macro.usesCaller), true
			}
		}
	case jkFloat:
		switch name {
		case "real":
			return obj, true
		case "imag":
			return jFloatV(0), true
		case "is_integer", "hex", "conjugate", "as_integer_ratio":
			return jBoundMethod(obj, name), true
		}
	case jkInt, jkBig, jkBool:
		switch name {
		case "real", "numerator":
			if obj.k == jkBool {
				return jIntV(obj.n), true
			}
			return obj, true
		case "imag":
			return jIntV(0), true
		case "denominator":
			return jIntV(1), true
		case "bit_length", "conjugate":
			return jBoundMethod(obj, name), true
		}
	}
	return jv{}, false
}

func jBoundMethod(obj jv, name string) jv {
	return jv{k: jkFunc, o: &jCallable{name: jValueTypeName(obj) + "." + name, recv: obj, method: name}}
}

// getattr is obj.name: the attribute, else the item, else Undefined.
func (e *jEval) getattr(obj jv, name string) (jv, error) {
	if obj.k == jkUndef {
		return jv{}, jUndefError(obj)
	}
	if obj.k == jkDict {
		// fast path for the common message.role / tool.function lookups
		if !jDictMethods[name] && !jDictUnsafe[name] && !strings.HasPrefix(name, "__") {
			if v, ok := obj.dict().getStr(name); ok {
				return v, nil
			}
			return jUndefAttr(obj, name), nil
		}
	}
	if v, ok := e.attribute(obj, name); ok {
		return v, nil
	}
	switch obj.k {
	case jkDict:
		if v, ok := obj.dict().getStr(name); ok {
			return v, nil
		}
	}
	return jUndefAttr(obj, name), nil
}

// getitem is obj[key]: the item, else (for string keys) the attribute, else Undefined.
func (e *jEval) getitem(obj jv, key jv) (jv, error) {
	switch obj.k {
	case jkUndef:
		return jv{}, jUndefError(obj)
	case jkDict:
		if jHashable(key) {
			if v, ok := obj.dict().get(key); ok {
				return v, nil
			}
		}
	case jkList, jkTuple, jkStr:
		if key.k == jkInt || key.k == jkBool || key.k == jkBig {
			n := 0
			if obj.k == jkStr {
				n = jStrLen(obj.s)
			} else {
				n = len(obj.list().items)
			}
			if key.k != jkBig {
				i := key.n
				if i < 0 {
					i += int64(n)
				}
				if i >= 0 && i < int64(n) {
					if obj.k == jkStr {
						return jStrV(jStrIndex(obj.s, int(i))), nil
					}
					return obj.list().items[i], nil
				}
			}
			return jUndefElem(obj, key), nil
		}
	case jkLoop, jkNS, jkCycler:
	}
	if key.k == jkStr {
		if v, ok := e.attribute(obj, key.s); ok {
			return v, nil
		}
		return jUndefAttr(obj, key.s), nil
	}
	return jUndefElem(obj, key), nil
}

// jStrIndex returns the i-th code point of s as a string.
func jStrIndex(s string, i int) string {
	if jIsASCII(s) {
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

func (e *jEval) slice(obj jv, sl *jeSlice, s *jScope) (jv, error) {
	var bounds [3]jv
	for i, x := range []jExpr{sl.start, sl.stop, sl.step} {
		if x == nil {
			bounds[i] = jvNone
			continue
		}
		v, err := e.eval(x, s)
		if err != nil {
			return jv{}, err
		}
		bounds[i] = v
	}
	switch obj.k {
	case jkUndef:
		return jv{}, jUndefError(obj)
	case jkList, jkTuple, jkStr:
	default:
		return jUndefElem(obj, jvNone), nil
	}
	var n int
	var runes []rune
	if obj.k == jkStr {
		if jIsASCII(obj.s) {
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
		case jkNone:
			idx[i] = math.MinInt64
		case jkInt, jkBool:
			idx[i] = b.n
		case jkBig:
			if b.o.(*big.Int).Sign() > 0 {
				idx[i] = math.MaxInt64 / 2
			} else {
				idx[i] = -math.MaxInt64 / 2
			}
		case jkUndef:
			return jv{}, jUndefError(b)
		default:
			return jv{}, jErrorf("TypeError", "slice indices must be integers or None or have an __index__ method")
		}
	}
	start, stop, step, err := jSliceIndices(idx[0], idx[1], idx[2], n)
	if err != nil {
		return jv{}, err
	}
	switch obj.k {
	case jkStr:
		if runes == nil && step == 1 {
			if stop < start {
				return jvEmptyStr, nil
			}
			return jStrV(obj.s[start:stop]), nil
		}
		if runes == nil {
			runes = []rune(obj.s)
		}
		var b strings.Builder
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			b.WriteRune(runes[i])
		}
		return jStrV(b.String()), nil
	default:
		src := obj.list().items
		var out []jv
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			out = append(out, src[i])
		}
		if obj.k == jkTuple {
			return jTupleV(out), nil
		}
		return jListV(out), nil
	}
}

// jSliceIndices is slice.indices(n); absent bounds are math.MinInt64.
func jSliceIndices(start, stop, step int64, n int) (int, int, int, error) {
	st := int64(1)
	if step != math.MinInt64 {
		st = step
	}
	if st == 0 {
		return 0, 0, 0, jErrorf("ValueError", "slice step cannot be zero")
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
