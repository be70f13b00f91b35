package jinja

// Operators: Python's arithmetic on int (arbitrary precision), float, str and
// sequences, with CPython's results and error messages.

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

func numOperands(a, b Value) bool { return a.isNumber() && b.isNumber() }

func asFloat(v Value) (float64, error) {
	switch v.k {
	case KindFloat:
		return v.f, nil
	case KindInt, KindBool:
		return float64(v.n), nil
	case kindBig:
		f, _ := new(big.Float).SetInt(v.o.(*big.Int)).Float64()
		if math.IsInf(f, 0) {
			return 0, errorf("OverflowError", "int too large to convert to float")
		}
		return f, nil
	}
	return 0, errorf("TypeError", "must be real number, not %s", v.TypeName())
}

func unsupportedOperands(op string, a, b Value) error {
	if a.k == KindUndefined {
		return undefinedError(a)
	}
	if b.k == KindUndefined {
		return undefinedError(b)
	}
	return errorf("TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, a.TypeName(), b.TypeName())
}

func add(a, b Value) (Value, error) {
	if numOperands(a, b) {
		if a.k == KindFloat || b.k == KindFloat {
			x, err := asFloat(a)
			if err != nil {
				return Value{}, err
			}
			y, err := asFloat(b)
			if err != nil {
				return Value{}, err
			}
			return floatValue(x + y), nil
		}
		if a.k != kindBig && b.k != kindBig {
			s := a.n + b.n
			if (s > a.n) == (b.n > 0) {
				return intValue(s), nil
			}
		}
		return bigValue(new(big.Int).Add(bigOf(a), bigOf(b))), nil
	}
	switch {
	case a.k == KindUndefined:
		return Value{}, undefinedError(a)
	case b.k == KindUndefined:
		return Value{}, undefinedError(b)
	case a.k == KindString && b.k == KindString:
		if len(a.s)+len(b.s) > maxOutput {
			return Value{}, errorf("MemoryError", "string too large")
		}
		return StringValue(a.s + b.s), nil
	case a.k == KindString:
		return Value{}, errorf("TypeError", "can only concatenate str (not \"%s\") to str", b.TypeName())
	case (a.k == KindList && b.k == KindList) || (a.k == kindTuple && b.k == kindTuple):
		if len(a.list().items)+len(b.list().items) > maxItems {
			return Value{}, errorf("MemoryError", "sequence too large")
		}
	}
	switch {
	case a.k == KindList && b.k == KindList:
		x, y := a.list().items, b.list().items
		out := make([]Value, 0, len(x)+len(y))
		return ListValue(append(append(out, x...), y...)), nil
	case a.k == KindList:
		return Value{}, errorf("TypeError", "can only concatenate list (not \"%s\") to list", b.TypeName())
	case a.k == kindTuple && b.k == kindTuple:
		x, y := a.list().items, b.list().items
		out := make([]Value, 0, len(x)+len(y))
		return tupleValue(append(append(out, x...), y...)), nil
	case a.k == kindTuple:
		return Value{}, errorf("TypeError", "can only concatenate tuple (not \"%s\") to tuple", b.TypeName())
	}
	return Value{}, unsupportedOperands("+", a, b)
}

func negate(v Value) (Value, error) {
	switch v.k {
	case KindInt, KindBool:
		if v.n == math.MinInt64 {
			return bigValue(new(big.Int).Neg(bigOf(v))), nil
		}
		return intValue(-v.n), nil
	case kindBig:
		return bigValue(new(big.Int).Neg(v.o.(*big.Int))), nil
	case KindFloat:
		return floatValue(-v.f), nil
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return Value{}, errorf("TypeError", "bad operand type for unary -: '%s'", v.TypeName())
}

func unaryPlus(v Value) (Value, error) {
	switch v.k {
	case KindInt, KindBool:
		return intValue(v.n), nil
	case kindBig, KindFloat:
		return v, nil
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return Value{}, errorf("TypeError", "bad operand type for unary +: '%s'", v.TypeName())
}

func repeat(seq Value, count Value) (Value, error) {
	if count.k == kindBig {
		if count.o.(*big.Int).Sign() < 0 {
			count = intValue(0)
		} else {
			return Value{}, errorf("OverflowError", "cannot fit 'int' into an index-sized integer")
		}
	}
	n := count.n
	if n < 0 {
		n = 0
	}
	switch seq.k {
	case KindString:
		if int64(len(seq.s))*n > maxOutput {
			return Value{}, errorf("MemoryError", "repeated string too large")
		}
		return StringValue(strings.Repeat(seq.s, int(n))), nil
	default:
		items := seq.list().items
		if int64(len(items))*n > maxItems {
			return Value{}, errorf("MemoryError", "repeated sequence too large")
		}
		out := make([]Value, 0, int64(len(items))*n)
		for i := int64(0); i < n; i++ {
			out = append(out, items...)
		}
		if seq.k == kindTuple {
			return tupleValue(out), nil
		}
		return ListValue(out), nil
	}
}

func binaryOp(op string, a, b Value) (Value, error) {
	switch op {
	case "+":
		return add(a, b)
	case "-":
		if !numOperands(a, b) {
			return Value{}, unsupportedOperands("-", a, b)
		}
		if a.k == KindFloat || b.k == KindFloat {
			x, err := asFloat(a)
			if err != nil {
				return Value{}, err
			}
			y, err := asFloat(b)
			if err != nil {
				return Value{}, err
			}
			return floatValue(x - y), nil
		}
		if a.k != kindBig && b.k != kindBig {
			d := a.n - b.n
			if (d < a.n) == (b.n > 0) {
				return intValue(d), nil
			}
		}
		return bigValue(new(big.Int).Sub(bigOf(a), bigOf(b))), nil
	case "*":
		switch {
		case numOperands(a, b):
			if a.k == KindFloat || b.k == KindFloat {
				x, err := asFloat(a)
				if err != nil {
					return Value{}, err
				}
				y, err := asFloat(b)
				if err != nil {
					return Value{}, err
				}
				return floatValue(x * y), nil
			}
			if a.k != kindBig && b.k != kindBig {
				if a.n == 0 || b.n == 0 {
					return intValue(0), nil
				}
				p := a.n * b.n
				if p/b.n == a.n && !(a.n == -1 && b.n == math.MinInt64) && !(b.n == -1 && a.n == math.MinInt64) {
					return intValue(p), nil
				}
			}
			return bigValue(new(big.Int).Mul(bigOf(a), bigOf(b))), nil
		case (a.k == KindString || a.isSeq()) && b.isInteger():
			return repeat(a, b)
		case a.isInteger() && (b.k == KindString || b.isSeq()):
			return repeat(b, a)
		}
		if (a.k == KindString || a.isSeq()) && b.k != KindUndefined && b.k != KindFloat {
			return Value{}, errorf("TypeError", "can't multiply sequence by non-int of type '%s'", b.TypeName())
		}
		return Value{}, unsupportedOperands("*", a, b)
	case "/":
		if !numOperands(a, b) {
			return Value{}, unsupportedOperands("/", a, b)
		}
		x, err := asFloat(a)
		if err != nil {
			return Value{}, err
		}
		y, err := asFloat(b)
		if err != nil {
			return Value{}, err
		}
		if y == 0 {
			if a.k == KindFloat || b.k == KindFloat {
				return Value{}, errorf("ZeroDivisionError", "float division by zero")
			}
			return Value{}, errorf("ZeroDivisionError", "division by zero")
		}
		return floatValue(x / y), nil
	case "//", "%":
		if op == "%" && a.k == KindString {
			s, err := percentFormat(a.s, b)
			if err != nil {
				return Value{}, err
			}
			return StringValue(s), nil
		}
		if !numOperands(a, b) {
			return Value{}, unsupportedOperands(op, a, b)
		}
		if a.k == KindFloat || b.k == KindFloat {
			x, err := asFloat(a)
			if err != nil {
				return Value{}, err
			}
			y, err := asFloat(b)
			if err != nil {
				return Value{}, err
			}
			if y == 0 {
				if op == "%" {
					return Value{}, errorf("ZeroDivisionError", "float modulo")
				}
				return Value{}, errorf("ZeroDivisionError", "float floor division by zero")
			}
			div, mod := floatDivmod(x, y)
			if op == "%" {
				return floatValue(mod), nil
			}
			return floatValue(div), nil
		}
		if (b.k != kindBig && b.n == 0) || (b.k == kindBig && b.o.(*big.Int).Sign() == 0) {
			return Value{}, errorf("ZeroDivisionError", "integer division or modulo by zero")
		}
		if a.k != kindBig && b.k != kindBig && !(a.n == math.MinInt64 && b.n == -1) {
			q, r := a.n/b.n, a.n%b.n
			if r != 0 && (r < 0) != (b.n < 0) {
				q--
				r += b.n
			}
			if op == "%" {
				return intValue(r), nil
			}
			return intValue(q), nil
		}
		x, y := bigOf(a), bigOf(b)
		q, m := new(big.Int), new(big.Int)
		q.DivMod(x, y, m) // Euclidean: 0 <= m < |y|
		if m.Sign() != 0 && y.Sign() < 0 {
			m.Add(m, y)
			q.Add(q, big.NewInt(1))
		}
		if op == "%" {
			return bigValue(m), nil
		}
		return bigValue(q), nil
	case "**":
		if !numOperands(a, b) {
			return Value{}, unsupportedOperands("** or pow()", a, b)
		}
		if a.k != KindFloat && b.k != KindFloat {
			exp := bigOf(b)
			if exp.Sign() >= 0 {
				base := bigOf(a)
				if exp.BitLen() > 32 || int64(base.BitLen())*exp.Int64() > 1<<20 {
					if base.BitLen() > 1 || base.Sign() < 0 && base.BitLen() > 1 {
						return Value{}, errorf("OverflowError", "integer power result too large")
					}
				}
				return bigValue(new(big.Int).Exp(base, exp, nil)), nil
			}
		}
		x, err := asFloat(a)
		if err != nil {
			return Value{}, err
		}
		y, err := asFloat(b)
		if err != nil {
			return Value{}, err
		}
		if x == 0 && y < 0 {
			return Value{}, errorf("ZeroDivisionError", "0.0 cannot be raised to a negative power")
		}
		if x < 0 && y != math.Trunc(y) {
			return Value{}, errorf("ValueError", "complex results are not supported")
		}
		r := math.Pow(x, y)
		if math.IsInf(r, 0) && !math.IsInf(x, 0) && !math.IsInf(y, 0) {
			return Value{}, errorf("OverflowError", "(34, 'Numerical result out of range')")
		}
		return floatValue(r), nil
	}
	return Value{}, fmt.Errorf("internal: operator %s", op)
}

// floatDivmod is Python's float divmod.
func floatDivmod(vx, wx float64) (float64, float64) {
	mod := math.Mod(vx, wx)
	div := (vx - mod) / wx
	if mod != 0 {
		if (wx < 0) != (mod < 0) {
			mod += wx
			div -= 1.0
		}
	} else {
		mod = math.Copysign(0, wx)
	}
	var floordiv float64
	if div != 0 {
		floordiv = math.Floor(div)
		if div-floordiv > 0.5 {
			floordiv += 1.0
		}
	} else {
		floordiv = math.Copysign(0, vx/wx)
	}
	return floordiv, mod
}
