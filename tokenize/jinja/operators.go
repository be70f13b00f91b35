package jinja

// Operators: Python's arithmetic on int (arbitrary precision), float, str and
// sequences, with CPython's results and error messages.

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

func jNumOperands(a, b jv) bool { return a.isNumber() && b.isNumber() }

func jAsFloat(v jv) (float64, error) {
	switch v.k {
	case jkFloat:
		return v.f, nil
	case jkInt, jkBool:
		return float64(v.n), nil
	case jkBig:
		f, _ := new(big.Float).SetInt(v.o.(*big.Int)).Float64()
		if math.IsInf(f, 0) {
			return 0, jErrorf("OverflowError", "int too large to convert to float")
		}
		return f, nil
	}
	return 0, jErrorf("TypeError", "must be real number, not %s", jValueTypeName(v))
}

func jUnsupported(op string, a, b jv) error {
	if a.k == jkUndef {
		return jUndefError(a)
	}
	if b.k == jkUndef {
		return jUndefError(b)
	}
	return jErrorf("TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, jValueTypeName(a), jValueTypeName(b))
}

func jAdd(a, b jv) (jv, error) {
	if jNumOperands(a, b) {
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			return jFloatV(x + y), nil
		}
		if a.k != jkBig && b.k != jkBig {
			s := a.n + b.n
			if (s > a.n) == (b.n > 0) {
				return jIntV(s), nil
			}
		}
		return jBigV(new(big.Int).Add(jBigOf(a), jBigOf(b))), nil
	}
	switch {
	case a.k == jkUndef:
		return jv{}, jUndefError(a)
	case b.k == jkUndef:
		return jv{}, jUndefError(b)
	case a.k == jkStr && b.k == jkStr:
		if len(a.s)+len(b.s) > jMaxOutput {
			return jv{}, jErrorf("MemoryError", "string too large")
		}
		return jStrV(a.s + b.s), nil
	case a.k == jkStr:
		return jv{}, jErrorf("TypeError", "can only concatenate str (not \"%s\") to str", jValueTypeName(b))
	case (a.k == jkList && b.k == jkList) || (a.k == jkTuple && b.k == jkTuple):
		if len(a.list().items)+len(b.list().items) > jMaxItems {
			return jv{}, jErrorf("MemoryError", "sequence too large")
		}
	}
	switch {
	case a.k == jkList && b.k == jkList:
		x, y := a.list().items, b.list().items
		out := make([]jv, 0, len(x)+len(y))
		return jListV(append(append(out, x...), y...)), nil
	case a.k == jkList:
		return jv{}, jErrorf("TypeError", "can only concatenate list (not \"%s\") to list", jValueTypeName(b))
	case a.k == jkTuple && b.k == jkTuple:
		x, y := a.list().items, b.list().items
		out := make([]jv, 0, len(x)+len(y))
		return jTupleV(append(append(out, x...), y...)), nil
	case a.k == jkTuple:
		return jv{}, jErrorf("TypeError", "can only concatenate tuple (not \"%s\") to tuple", jValueTypeName(b))
	}
	return jv{}, jUnsupported("+", a, b)
}

func jNeg(v jv) (jv, error) {
	switch v.k {
	case jkInt, jkBool:
		if v.n == math.MinInt64 {
			return jBigV(new(big.Int).Neg(jBigOf(v))), nil
		}
		return jIntV(-v.n), nil
	case jkBig:
		return jBigV(new(big.Int).Neg(v.o.(*big.Int))), nil
	case jkFloat:
		return jFloatV(-v.f), nil
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return jv{}, jErrorf("TypeError", "bad operand type for unary -: '%s'", jValueTypeName(v))
}

func jPos(v jv) (jv, error) {
	switch v.k {
	case jkInt, jkBool:
		return jIntV(v.n), nil
	case jkBig, jkFloat:
		return v, nil
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return jv{}, jErrorf("TypeError", "bad operand type for unary +: '%s'", jValueTypeName(v))
}

func jRepeat(seq jv, count jv) (jv, error) {
	if count.k == jkBig {
		if count.o.(*big.Int).Sign() < 0 {
			count = jIntV(0)
		} else {
			return jv{}, jErrorf("OverflowError", "cannot fit 'int' into an index-sized integer")
		}
	}
	n := count.n
	if n < 0 {
		n = 0
	}
	switch seq.k {
	case jkStr:
		if int64(len(seq.s))*n > jMaxOutput {
			return jv{}, jErrorf("MemoryError", "repeated string too large")
		}
		return jStrV(strings.Repeat(seq.s, int(n))), nil
	default:
		items := seq.list().items
		if int64(len(items))*n > jMaxItems {
			return jv{}, jErrorf("MemoryError", "repeated sequence too large")
		}
		out := make([]jv, 0, int64(len(items))*n)
		for i := int64(0); i < n; i++ {
			out = append(out, items...)
		}
		if seq.k == jkTuple {
			return jTupleV(out), nil
		}
		return jListV(out), nil
	}
}

func jBinary(op string, a, b jv) (jv, error) {
	switch op {
	case "+":
		return jAdd(a, b)
	case "-":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("-", a, b)
		}
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			return jFloatV(x - y), nil
		}
		if a.k != jkBig && b.k != jkBig {
			d := a.n - b.n
			if (d < a.n) == (b.n > 0) {
				return jIntV(d), nil
			}
		}
		return jBigV(new(big.Int).Sub(jBigOf(a), jBigOf(b))), nil
	case "*":
		switch {
		case jNumOperands(a, b):
			if a.k == jkFloat || b.k == jkFloat {
				x, err := jAsFloat(a)
				if err != nil {
					return jv{}, err
				}
				y, err := jAsFloat(b)
				if err != nil {
					return jv{}, err
				}
				return jFloatV(x * y), nil
			}
			if a.k != jkBig && b.k != jkBig {
				if a.n == 0 || b.n == 0 {
					return jIntV(0), nil
				}
				p := a.n * b.n
				if p/b.n == a.n && !(a.n == -1 && b.n == math.MinInt64) && !(b.n == -1 && a.n == math.MinInt64) {
					return jIntV(p), nil
				}
			}
			return jBigV(new(big.Int).Mul(jBigOf(a), jBigOf(b))), nil
		case (a.k == jkStr || a.isSeq()) && b.isInteger():
			return jRepeat(a, b)
		case a.isInteger() && (b.k == jkStr || b.isSeq()):
			return jRepeat(b, a)
		}
		if (a.k == jkStr || a.isSeq()) && b.k != jkUndef && b.k != jkFloat {
			return jv{}, jErrorf("TypeError", "can't multiply sequence by non-int of type '%s'", jValueTypeName(b))
		}
		return jv{}, jUnsupported("*", a, b)
	case "/":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("/", a, b)
		}
		x, err := jAsFloat(a)
		if err != nil {
			return jv{}, err
		}
		y, err := jAsFloat(b)
		if err != nil {
			return jv{}, err
		}
		if y == 0 {
			if a.k == jkFloat || b.k == jkFloat {
				return jv{}, jErrorf("ZeroDivisionError", "float division by zero")
			}
			return jv{}, jErrorf("ZeroDivisionError", "division by zero")
		}
		return jFloatV(x / y), nil
	case "//", "%":
		if op == "%" && a.k == jkStr {
			s, err := jPercentFormat(a.s, b)
			if err != nil {
				return jv{}, err
			}
			return jStrV(s), nil
		}
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported(op, a, b)
		}
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			if y == 0 {
				if op == "%" {
					return jv{}, jErrorf("ZeroDivisionError", "float modulo")
				}
				return jv{}, jErrorf("ZeroDivisionError", "float floor division by zero")
			}
			div, mod := jFloatDivmod(x, y)
			if op == "%" {
				return jFloatV(mod), nil
			}
			return jFloatV(div), nil
		}
		if (b.k != jkBig && b.n == 0) || (b.k == jkBig && b.o.(*big.Int).Sign() == 0) {
			return jv{}, jErrorf("ZeroDivisionError", "integer division or modulo by zero")
		}
		if a.k != jkBig && b.k != jkBig && !(a.n == math.MinInt64 && b.n == -1) {
			q, r := a.n/b.n, a.n%b.n
			if r != 0 && (r < 0) != (b.n < 0) {
				q--
				r += b.n
			}
			if op == "%" {
				return jIntV(r), nil
			}
			return jIntV(q), nil
		}
		x, y := jBigOf(a), jBigOf(b)
		q, m := new(big.Int), new(big.Int)
		q.DivMod(x, y, m) // Euclidean: 0 <= m < |y|
		if m.Sign() != 0 && y.Sign() < 0 {
			m.Add(m, y)
			q.Add(q, big.NewInt(1))
		}
		if op == "%" {
			return jBigV(m), nil
		}
		return jBigV(q), nil
	case "**":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("** or pow()", a, b)
		}
		if a.k != jkFloat && b.k != jkFloat {
			exp := jBigOf(b)
			if exp.Sign() >= 0 {
				base := jBigOf(a)
				if exp.BitLen() > 32 || int64(base.BitLen())*exp.Int64() > 1<<20 {
					if base.BitLen() > 1 || base.Sign() < 0 && base.BitLen() > 1 {
						return jv{}, jErrorf("OverflowError", "integer power result too large")
					}
				}
				return jBigV(new(big.Int).Exp(base, exp, nil)), nil
			}
		}
		x, err := jAsFloat(a)
		if err != nil {
			return jv{}, err
		}
		y, err := jAsFloat(b)
		if err != nil {
			return jv{}, err
		}
		if x == 0 && y < 0 {
			return jv{}, jErrorf("ZeroDivisionError", "0.0 cannot be raised to a negative power")
		}
		if x < 0 && y != math.Trunc(y) {
			return jv{}, jErrorf("ValueError", "complex results are not supported")
		}
		r := math.Pow(x, y)
		if math.IsInf(r, 0) && !math.IsInf(x, 0) && !math.IsInf(y, 0) {
			return jv{}, jErrorf("OverflowError", "(34, 'Numerical result out of range')")
		}
		return jFloatV(r), nil
	}
	return jv{}, fmt.Errorf("internal: operator %s", op)
}

// jFloatDivmod is Python's float divmod.
func jFloatDivmod(vx, wx float64) (float64, float64) {
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
