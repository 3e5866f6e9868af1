"""`comfy_api.latest.io` (tests only): V3 node definitions as upstream's
(v0.3.64) behave where bulkhead depends on them.

A node is a `ComfyNode` subclass with classmethods `define_schema() ->
Schema` and `execute(**inputs)` (sync or async), and optionally
`validate_inputs`, `fingerprint_inputs`, `check_lazy_status`.  The V1
attributes the executor and /object_info read (INPUT_TYPES, RETURN_TYPES,
RETURN_NAMES, OUTPUT_IS_LIST, OUTPUT_NODE, INPUT_IS_LIST, NOT_IDEMPOTENT,
CATEGORY, DESCRIPTION, DEPRECATED, EXPERIMENTAL, API_NODE, FUNCTION) are
derived from the schema as upstream derives them: GET_SCHEMA() finalises
(output nodes get hidden PROMPT and EXTRA_PNGINFO, API nodes the two auth
keys, outputs without an id get `_<i>_<type>_`), validates (unique ids)
and caches the class attributes; INPUT_TYPES() is the V1 input dict
(dynamic inputs flattened through get_dynamic(), hidden as
`{name: (VALUE,)}`); GET_NODE_INFO_V1() is what /object_info serves.
FUNCTION names EXECUTE_NORMALIZED(_ASYNC), which turns what execute
returned (None, a tuple, a dict, an ExecutionBlocker) into a NodeOutput
and refuses an `expand` unless the schema has enable_expand.

Types: Boolean, Int, Float, String, Combo, MultiCombo, Image, Mask,
Latent, Conditioning, Model, Clip, Vae, Sampler, Sigmas, Noise, AnyType,
Custom(io_type), MultiType, AutogrowDynamic, MatchType.  Not here: the
other upstream types, resources, the V3 node info.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import copy
import dataclasses
import inspect
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from comfy_api.internal import (_ComfyNodeInternal, _NodeOutputInternal, classproperty, first_real_override,
                                is_class, prune_dict, shallow_clone_class)
from comfy_execution.graph_utils import ExecutionBlocker


class FolderType(str, Enum):
    input = "input"
    output = "output"
    temp = "temp"


class UploadType(str, Enum):
    image = "image_upload"
    audio = "audio_upload"
    video = "video_upload"
    model = "file_upload"


class NumberDisplay(str, Enum):
    number = "number"
    slider = "slider"


class _StringIOType(str):
    """A type name that matches "*" and any type sharing a comma-separated
    member (a != b is False then)."""

    def __ne__(self, other):
        if self == "*" or other == "*":
            return False
        if not isinstance(other, str):
            return True
        mine, theirs = set(self.split(",")), set(other.split(","))
        return not (mine <= theirs or theirs <= mine)

    __hash__ = str.__hash__


# --- inputs and outputs ---

class _IO_V3:
    Parent = None

    @property
    def io_type(self):
        return self.Parent.io_type

    @property
    def Type(self):
        return self.Parent.Type


class Input(_IO_V3):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, extra_dict=None):
        self.id = id
        self.display_name = display_name
        self.optional = optional
        self.tooltip = tooltip
        self.lazy = lazy
        self.extra_dict = extra_dict or {}

    def as_dict(self):
        return {**prune_dict({"display_name": self.display_name, "optional": self.optional,
                              "tooltip": self.tooltip, "lazy": self.lazy}), **prune_dict(self.extra_dict)}

    def get_io_type(self):
        return _StringIOType(self.io_type)


class WidgetInput(Input):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                 socketless=None, widget_type=None, force_input=None, extra_dict=None):
        super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
        self.default = default
        self.socketless = socketless
        self.widget_type = widget_type
        self.force_input = force_input

    def as_dict(self):
        return {**super().as_dict(), **prune_dict({"default": self.default, "socketless": self.socketless,
                                                   "widgetType": self.widget_type,
                                                   "forceInput": self.force_input})}

    def get_io_type(self):
        return self.widget_type if self.widget_type is not None else super().get_io_type()


class Output(_IO_V3):
    def __init__(self, id=None, display_name=None, tooltip=None, is_output_list=False):
        self.id = id
        self.display_name = display_name
        self.tooltip = tooltip
        self.is_output_list = is_output_list

    def as_dict(self):
        return prune_dict({"display_name": self.display_name, "tooltip": self.tooltip,
                           "is_output_list": self.is_output_list})

    def get_io_type(self):
        return self.io_type


class _ComfyType(ABC):
    Type = Any
    io_type = None


class ComfyTypeI(_ComfyType):
    class Input(Input):
        pass


class ComfyTypeIO(ComfyTypeI):
    class Output(Output):
        pass


def _own_copy(cls):
    return type(cls.__name__, (cls,), {"__qualname__": cls.__qualname__, "__module__": cls.__module__})


def comfytype(io_type):
    """Class decorator: binds io_type to a ComfyType; its Input and Output
    classes (its own or, copied, the defaults) get it as their Parent."""
    def bind(cls):
        if not issubclass(cls, _ComfyType):
            cls = type(cls.__name__, (cls, ComfyTypeIO), {"__module__": cls.__module__,
                                                          "__qualname__": cls.__qualname__})
        for part in ("Input", "Output"):
            klass = getattr(cls, part, None)
            if klass is not None:
                klass = _own_copy(klass)
                klass.__qualname__ = f"{cls.__qualname__}.{part}"
                klass.Parent = cls
                setattr(cls, part, klass)
        cls.io_type = _StringIOType(io_type)
        return cls
    return bind


def Custom(io_type):
    """A ComfyType for a type name of the pack's own."""
    @comfytype(io_type)
    class CustomComfyType(ComfyTypeIO):
        pass
    return CustomComfyType


@comfytype("BOOLEAN")
class Boolean(ComfyTypeIO):
    Type = bool

    class Input(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                     label_on=None, label_off=None, socketless=None, force_input=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input)
            self.label_on = label_on
            self.label_off = label_off

        def as_dict(self):
            return {**super().as_dict(), **prune_dict({"label_on": self.label_on, "label_off": self.label_off})}


class _Number(WidgetInput):
    _keys = ("min", "max", "step")

    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                 min=None, max=None, step=None, display_mode=None, socketless=None, force_input=None, **more):
        super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input)
        self.min, self.max, self.step, self.display_mode = min, max, step, display_mode
        for k, v in more.items():
            setattr(self, k, v)

    def as_dict(self):
        display = self.display_mode.value if isinstance(self.display_mode, Enum) else self.display_mode
        return {**super().as_dict(), **prune_dict({k: getattr(self, k) for k in self._keys}),
                **prune_dict({"display": display})}


@comfytype("INT")
class Int(ComfyTypeIO):
    Type = int

    class Input(_Number):
        _keys = ("min", "max", "step", "control_after_generate")

        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                     min=None, max=None, step=None, control_after_generate=None, display_mode=None,
                     socketless=None, force_input=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, min, max, step, display_mode,
                             socketless, force_input, control_after_generate=control_after_generate)


@comfytype("FLOAT")
class Float(ComfyTypeIO):
    Type = float

    class Input(_Number):
        _keys = ("min", "max", "step", "round")

        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                     min=None, max=None, step=None, round=None, display_mode=None, socketless=None,
                     force_input=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, min, max, step, display_mode,
                             socketless, force_input, round=round)


@comfytype("STRING")
class String(ComfyTypeIO):
    Type = str

    class Input(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, multiline=False,
                     placeholder=None, default=None, dynamic_prompts=None, socketless=None, force_input=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input)
            self.multiline = multiline
            self.placeholder = placeholder
            self.dynamic_prompts = dynamic_prompts

        def as_dict(self):
            return {**super().as_dict(), **prune_dict({"multiline": self.multiline, "placeholder": self.placeholder,
                                                       "dynamicPrompts": self.dynamic_prompts})}


@comfytype("COMBO")
class Combo(ComfyTypeIO):
    Type = str

    class Input(WidgetInput):
        def __init__(self, id, options=None, display_name=None, optional=False, tooltip=None, lazy=None,
                     default=None, control_after_generate=None, upload=None, image_folder=None, remote=None,
                     socketless=None):
            if isinstance(options, type) and issubclass(options, Enum):
                options = [m.value for m in options]
            if isinstance(default, Enum):
                default = default.value
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless)
            self.multiselect = False
            self.options = options
            self.control_after_generate = control_after_generate
            self.upload = upload
            self.image_folder = image_folder
            self.remote = remote

        def as_dict(self):
            out = {**super().as_dict(), **prune_dict({
                "multiselect": self.multiselect, "options": self.options,
                "control_after_generate": self.control_after_generate,
                "image_folder": self.image_folder.value if self.image_folder else None,
                "remote": self.remote.as_dict() if self.remote else None})}
            if self.upload is not None:
                out[self.upload.value] = True
            return out

    class Output(Output):
        def __init__(self, id=None, display_name=None, options=None, tooltip=None, is_output_list=False):
            super().__init__(id, display_name, tooltip, is_output_list)
            self.options = options if options is not None else []

        @property
        def io_type(self):
            return self.options


@comfytype("COMBO")
class MultiCombo(ComfyTypeI):
    Type = list

    class Input(Combo.Input):
        def __init__(self, id, options, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                     placeholder=None, chip=None, control_after_generate=None, socketless=None):
            super().__init__(id, options, display_name, optional, tooltip, lazy, default, control_after_generate,
                             socketless=socketless)
            self.multiselect = True
            self.placeholder = placeholder
            self.chip = chip

        def as_dict(self):
            return {**super().as_dict(), **prune_dict({"multi_select": self.multiselect,
                                                       "placeholder": self.placeholder, "chip": self.chip})}


def _plain_type(name):
    @comfytype(name)
    class T(ComfyTypeIO):
        pass
    return T


Image = _plain_type("IMAGE")
Mask = _plain_type("MASK")
Latent = _plain_type("LATENT")
Conditioning = _plain_type("CONDITIONING")
Model = _plain_type("MODEL")
Clip = _plain_type("CLIP")
Vae = _plain_type("VAE")
Sampler = _plain_type("SAMPLER")
Sigmas = _plain_type("SIGMAS")
Noise = _plain_type("NOISE")
AnyType = _plain_type("*")
for _n, _t in (("Image", Image), ("Mask", Mask), ("Latent", Latent), ("Conditioning", Conditioning),
               ("Model", Model), ("Clip", Clip), ("Vae", Vae), ("Sampler", Sampler), ("Sigmas", Sigmas),
               ("Noise", Noise), ("AnyType", AnyType)):
    _t.__name__ = _t.__qualname__ = _n
    _t.Input.__qualname__, _t.Output.__qualname__ = f"{_n}.Input", f"{_n}.Output"


@comfytype("COMFY_MULTITYPED_V3")
class MultiType(ComfyTypeI):
    class Input(Input):
        """An input of several types; `id` may be another Input, whose
        widget and options it takes."""

        def __init__(self, id, types, display_name=None, optional=False, tooltip=None, lazy=None, extra_dict=None):
            self.input_override = None
            if isinstance(id, Input):
                self.input_override = copy.copy(id)
                optional = True if id.optional is True else optional
                tooltip = id.tooltip if id.tooltip is not None else tooltip
                display_name = id.display_name if id.display_name is not None else display_name
                lazy = id.lazy if id.lazy is not None else lazy
                if isinstance(self.input_override, WidgetInput):
                    self.input_override.widget_type = self.input_override.get_io_type()
                id = id.id
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            self._io_types = types

        def get_io_type(self):
            names = [t.io_type if is_class(t) else type(t).io_type for t in self._io_types]
            if self.input_override is not None:
                names.insert(0, self.input_override.get_io_type())
            return ",".join(dict.fromkeys(names))

        def as_dict(self):
            mine = super().as_dict()
            return {**self.input_override.as_dict(), **mine} if self.input_override is not None else mine


class DynamicInput(Input, ABC):
    @abstractmethod
    def get_dynamic(self):
        """The inputs this one stands for in the V1 input dict."""


class DynamicOutput(Output, ABC):
    @abstractmethod
    def get_dynamic(self):
        """The outputs this one stands for."""


@comfytype("COMFY_AUTOGROW_V3")
class AutogrowDynamic(ComfyTypeI):
    class Input(DynamicInput):
        """`min` required copies of template_input, then optional ones up
        to `max`, named <template id><n>_$<id>_ag$ (widgets as sockets)."""

        def __init__(self, id, template_input, min=1, max=None, display_name=None, optional=False, tooltip=None,
                     lazy=None, extra_dict=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            if (min is not None and min < 1) or (max is not None and max < 1):
                raise ValueError("AutogrowDynamic min and max must be at least 1")
            self.template_input, self.min, self.max = template_input, min, max

        def get_dynamic(self):
            out = []
            for n in range(1, max(self.min or 0, self.max or 0) + 1):
                x = copy.copy(self.template_input)
                x.id = f"{x.id}{n}_${self.id}_ag$"
                if x.display_name is not None:
                    x.display_name = f"{x.display_name}{n}"
                x.optional = (self.optional or x.optional) if n <= self.min else True
                if isinstance(self.template_input, WidgetInput):
                    x.force_input = True
                out.append(x)
            return out


@comfytype("COMFY_MATCHTYPE_V3")
class MatchType(ComfyTypeIO):
    class Template:
        def __init__(self, template_id, allowed_types):
            self.template_id = template_id
            self.allowed_types = [allowed_types] if isinstance(allowed_types, _ComfyType) else allowed_types

        def as_dict(self):
            return {"template_id": self.template_id,
                    "allowed_types": "".join(t.io_type for t in self.allowed_types)}

    class Input(DynamicInput):
        def __init__(self, id, template, display_name=None, optional=False, tooltip=None, lazy=None,
                     extra_dict=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            self.template = template

        def get_dynamic(self):
            return [self]

        def as_dict(self):
            return {**super().as_dict(), "template": self.template.as_dict()}

    class Output(DynamicOutput):
        def __init__(self, id, template, display_name=None, tooltip=None, is_output_list=False):
            super().__init__(id, display_name, tooltip, is_output_list)
            self.template = template

        def get_dynamic(self):
            return [self]

        def as_dict(self):
            return {**super().as_dict(), "template": self.template.as_dict()}


# --- hidden inputs ---

class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"
    auth_token_comfy_org = "AUTH_TOKEN_COMFY_ORG"
    api_key_comfy_org = "API_KEY_COMFY_ORG"


class HiddenHolder:
    """cls.hidden during a run: the hidden values the schema asked for
    (None for the others)."""

    def __init__(self, unique_id=None, prompt=None, extra_pnginfo=None, dynprompt=None,
                 auth_token_comfy_org=None, api_key_comfy_org=None, **_more):
        self.unique_id = unique_id
        self.prompt = prompt
        self.extra_pnginfo = extra_pnginfo
        self.dynprompt = dynprompt
        self.auth_token_comfy_org = auth_token_comfy_org
        self.api_key_comfy_org = api_key_comfy_org

    def __getattr__(self, name):
        return None

    @classmethod
    def from_dict(cls, d):
        d = d or {}
        return cls(**{h.name: d.get(h) for h in Hidden})


# --- the schema ---

@dataclasses.dataclass
class NodeInfoV1:
    input: dict = None
    input_order: dict = None
    output: list = None
    output_is_list: list = None
    output_name: list = None
    output_tooltips: list = None
    name: str = None
    display_name: str = None
    description: str = None
    python_module: Any = None
    category: str = None
    output_node: bool = None
    deprecated: bool = None
    experimental: bool = None
    api_node: bool = None


@dataclasses.dataclass
class Schema:
    node_id: str
    display_name: str = None
    category: str = "sd"
    inputs: list = None
    outputs: list = None
    hidden: list = None
    description: str = ""
    is_input_list: bool = False
    is_output_node: bool = False
    is_deprecated: bool = False
    is_experimental: bool = False
    is_api_node: bool = False
    not_idempotent: bool = False
    enable_expand: bool = False

    def validate(self):
        ins = [i.id for i in self.inputs or ()]
        outs = [o.id for o in self.outputs or ()]
        problems = []
        for what, ids in (("Input", ins), ("Output", outs)):
            dup = sorted({x for x in ids if ids.count(x) > 1})
            if dup:
                problems.append(f"{what} ids must be unique, but {dup} are not.")
        both = set(ins) & set(outs)
        if both:
            problems.append(f"Ids must be unique between inputs and outputs, but {both} are not.")
        if problems:
            raise ValueError("\n".join(problems))

    def finalize(self):
        wanted = []
        if self.is_api_node:
            wanted += [Hidden.auth_token_comfy_org, Hidden.api_key_comfy_org]
        if self.is_output_node:
            wanted += [Hidden.prompt, Hidden.extra_pnginfo]
        for h in wanted:
            if self.hidden is None:
                self.hidden = []
            if h not in self.hidden:
                self.hidden.append(h)
        for i, out in enumerate(self.outputs or ()):
            if out.id is None:
                out.id = f"_{i}_{out.io_type}_"

    def get_v1_info(self, cls):
        inputs = {"required": {}}
        for i in self.inputs or ():
            for x in (i.get_dynamic() if isinstance(i, DynamicInput) else [i]):
                add_to_dict_v1(x, inputs)
        for h in self.hidden or ():
            inputs.setdefault("hidden", {})[h.name] = (h.value,)
        outs = self.outputs or []
        return NodeInfoV1(
            input=inputs, input_order={k: list(v) for k, v in inputs.items()},
            output=[o.io_type for o in outs], output_is_list=[o.is_output_list for o in outs],
            output_name=[o.display_name or o.io_type for o in outs],
            output_tooltips=[o.tooltip or None for o in outs],
            name=self.node_id, display_name=self.display_name, description=self.description,
            python_module=getattr(cls, "RELATIVE_PYTHON_MODULE", "nodes"), category=self.category,
            output_node=self.is_output_node, deprecated=self.is_deprecated, experimental=self.is_experimental,
            api_node=self.is_api_node)


def add_to_dict_v1(i, inputs):
    d = i.as_dict()
    d.pop("optional", None)
    inputs.setdefault("optional" if i.optional else "required", {})[i.id] = (i.get_io_type(), d)


# --- nodes ---

class _SchemaAttr:
    """A V1 class attribute, read from the class's schema."""

    def __init__(self, read):
        self.read = read

    def __get__(self, obj, owner):
        return self.read(owner.GET_SCHEMA())


class ComfyNode(_ComfyNodeInternal):
    """The base of every V3 node."""

    RELATIVE_PYTHON_MODULE = None
    SCHEMA = None
    hidden = None

    @classmethod
    @abstractmethod
    def define_schema(cls):
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def execute(cls, **kwargs):
        raise NotImplementedError

    @classmethod
    def validate_inputs(cls, **kwargs):
        raise NotImplementedError

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        raise NotImplementedError

    @classmethod
    def check_lazy_status(cls, **kwargs):
        return [name for name, v in kwargs.items() if v is None]

    @classmethod
    def GET_BASE_CLASS(cls):
        return ComfyNode

    @classmethod
    def VALIDATE_CLASS(cls):
        for name in ("define_schema", "execute"):
            if first_real_override(cls, name) is None:
                raise Exception(f"No {name} function was defined for node class {cls.__name__}.")

    def __init__(self):
        type(self).VALIDATE_CLASS()

    @classproperty
    def FUNCTION(cls):
        return "EXECUTE_NORMALIZED_ASYNC" if inspect.iscoroutinefunction(cls.execute) else "EXECUTE_NORMALIZED"

    @classmethod
    def _normalized(cls, out):
        if out is None:
            out = NodeOutput()
        elif isinstance(out, tuple):
            out = NodeOutput(*out)
        elif isinstance(out, dict):
            out = NodeOutput.from_dict(out)
        elif isinstance(out, ExecutionBlocker):
            out = NodeOutput(block_execution=out.message)
        elif not isinstance(out, NodeOutput):
            raise Exception(f"Invalid return type from node: {type(out)}")
        if out.expand is not None and not cls.SCHEMA.enable_expand:
            raise Exception(f"Node {cls.__name__} is not expandable, but expand included in NodeOutput; "
                            "developer should set enable_expand=True on node's Schema to allow this.")
        return out

    @classmethod
    def EXECUTE_NORMALIZED(cls, *args, **kwargs):
        return cls._normalized(cls.execute(*args, **kwargs))

    @classmethod
    async def EXECUTE_NORMALIZED_ASYNC(cls, *args, **kwargs):
        return cls._normalized(await cls.execute(*args, **kwargs))

    @classmethod
    def PREPARE_CLASS_CLONE(cls, hidden_inputs):
        clone = shallow_clone_class(cls if is_class(cls) else type(cls))
        clone.hidden = HiddenHolder.from_dict(hidden_inputs)
        return clone

    @classmethod
    def FINALIZE_SCHEMA(cls):
        schema = cls.define_schema()
        schema.finalize()
        return schema

    @classmethod
    def GET_SCHEMA(cls):
        cls.VALIDATE_CLASS()
        schema = cls.FINALIZE_SCHEMA()
        schema.validate()
        cls.SCHEMA = schema
        return schema

    @classmethod
    def GET_NODE_INFO_V1(cls):
        return dataclasses.asdict(cls.GET_SCHEMA().get_v1_info(cls))

    @classmethod
    def INPUT_TYPES(cls, include_hidden=True, return_schema=False):
        schema = cls.FINALIZE_SCHEMA()
        inputs = schema.get_v1_info(cls).input
        if not include_hidden:
            inputs.pop("hidden", None)
        return (inputs, schema) if return_schema else inputs

    DESCRIPTION = _SchemaAttr(lambda s: s.description)
    CATEGORY = _SchemaAttr(lambda s: s.category)
    EXPERIMENTAL = _SchemaAttr(lambda s: s.is_experimental)
    DEPRECATED = _SchemaAttr(lambda s: s.is_deprecated)
    API_NODE = _SchemaAttr(lambda s: s.is_api_node)
    OUTPUT_NODE = _SchemaAttr(lambda s: s.is_output_node)
    INPUT_IS_LIST = _SchemaAttr(lambda s: s.is_input_list)
    NOT_IDEMPOTENT = _SchemaAttr(lambda s: s.not_idempotent)
    RETURN_TYPES = _SchemaAttr(lambda s: [o.io_type for o in s.outputs or ()])
    RETURN_NAMES = _SchemaAttr(lambda s: [o.display_name or o.io_type for o in s.outputs or ()])
    OUTPUT_IS_LIST = _SchemaAttr(lambda s: [o.is_output_list for o in s.outputs or ()])
    OUTPUT_TOOLTIPS = _SchemaAttr(lambda s: [o.tooltip or None for o in s.outputs or ()])


class NodeOutput(_NodeOutputInternal):
    """What execute returns: the output values, and optionally `ui` (a
    dict or a _UIOutput), `expand` (a graph) and `block_execution`."""

    def __init__(self, *args, ui=None, expand=None, block_execution=None):
        self.args = args
        self.ui = ui
        self.expand = expand
        self.block_execution = block_execution

    @property
    def result(self):
        return self.args or None

    @classmethod
    def from_dict(cls, data):
        result = data.get("result", ())
        if isinstance(result, ExecutionBlocker):
            return cls(block_execution=result.message)
        return cls(*result, ui=data.get("ui"), expand=data.get("expand"))

    def __getitem__(self, index):
        return self.args[index]


class _UIOutput(ABC):
    @abstractmethod
    def as_dict(self):
        """The node's `ui` entry of the history."""
