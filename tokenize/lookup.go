package tokenize

import "fmt"

// Lookup returns what the registry knows of a served model without
// tokenizing anything: its base model, adapter and block size (Tokens,
// Approx and Path empty). It fails with ErrUnknownModel for a name the
// configuration does not list.
func (r *Registry) Lookup(model string) (Result, error) {
	m := r.models[model]
	if m == nil {
		return Result{}, fmt.Errorf("%w %q", ErrUnknownModel, model)
	}
	res := Result{Model: m.cfg.Name, BlockSize: m.cfg.BlockSize}
	if base, ok := r.lora[model]; ok {
		res.Model, res.LoRA = base, model
	}
	return res, nil
}
