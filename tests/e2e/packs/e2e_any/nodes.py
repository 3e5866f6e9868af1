"""Nodes typed with the pack's own type strings, in the two patterns packs
use: the classic "any type" (a str whose != is always False; its == stays
str's) and ComfyUI's testing pack's SmartType ("*" fits everything; a
comma set fits any set holding it).  ComfyUI's validation compares them:
`input_type == "INT"` (and FLOAT, STRING, BOOLEAN) for each literal
conversion in turn, `received_type != input_type` for a link."""


class AnyType(str):
    def __ne__(self, other):
        return False


class SmartType(str):
    def __ne__(self, other):
        if self == "*" or other == "*":
            return False
        return not set(self.split(",")).issubset(set(other.split(",")))


class E2EAnyShow:
    """What a literal on an "any" input reaches the node as."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"any": (AnyType("*"), {}), "smart": (SmartType("*"), {})},
                "optional": {"number": (SmartType("FLOAT"), {})}}
    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True
    CATEGORY = "e2e/any"

    def show(self, any, smart, number=None):
        return {"ui": {"got": [[repr(any), type(any).__name__], [repr(smart), type(smart).__name__],
                               [repr(number), type(number).__name__]]}}


class E2EAnyImage:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = (SmartType("IMAGE"), SmartType("FLOAT"), AnyType("*"))
    FUNCTION = "make"
    CATEGORY = "e2e/any"

    def make(self):
        return ("an image", 1.5, "anything")


class E2EAnyNumber:
    """Takes FLOAT or INT; its VALIDATE_INPUTS wants each linked input's type
    to be the pack's own SmartType object, as the testing pack's
    VariantSupport does (`isinstance(value, SmartType)`)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": (SmartType("FLOAT,INT"), {})}}
    RETURN_TYPES = ()
    FUNCTION = "take"
    OUTPUT_NODE = True
    CATEGORY = "e2e/any"

    @classmethod
    def VALIDATE_INPUTS(cls, input_types):
        for name, t in input_types.items():
            if not isinstance(t, SmartType):
                return f"{name}: {type(t).__name__} {t!r} is not a SmartType"
        return True

    def take(self, value):
        return {"ui": {"got": [repr(value)]}}


class E2EAnyTake:
    """An "any" input without a VALIDATE_INPUTS: ComfyUI checks the link's type."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": (SmartType("FLOAT,INT"), {}), "anything": (AnyType("*"), {})}}
    RETURN_TYPES = ()
    FUNCTION = "take"
    OUTPUT_NODE = True
    CATEGORY = "e2e/any"

    def take(self, value, anything):
        return {"ui": {"got": [repr(value), repr(anything)]}}


NODE_CLASS_MAPPINGS = {"E2EAnyShow": E2EAnyShow, "E2EAnyImage": E2EAnyImage, "E2EAnyNumber": E2EAnyNumber,
                       "E2EAnyTake": E2EAnyTake}
