"""Personas: the app's and the characters a user makes (migration 0030). Each edit is a new version; a session
keeps the version it started with. A user's characters are theirs alone: listed to, and usable by, no one else."""

# No `from __future__ import annotations` here (routes/sessions.py says why).
import re

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router

from eros import errors
from eros.store import personas as persona_store

from models import AppPersona, AppPersonaList, NewPersona, PersonaEdit, PersonaList, PersonaView
from routes import OPERATORS, current_operator, current_user, documented

router = Router()
_NOT_YOURS = (404, "no character of yours by that id (the app's personas are not edited here)")


class TooManyPersonas(errors.ClientError):
    status, code = 409, "too_many_personas"


@router.get("/v1/personas", operation_id="listPersonas", tags=["sessions"],
            summary="the personas to chat with: the app's, then your own characters",
            responses=documented((200, "the personas")))
def personas() -> PersonaList:
    return PersonaList.model_validate({"personas": persona_store.usable(current_user(router))})


@router.post("/v1/personas", operation_id="createPersona", tags=["sessions"], summary="make a character of your own",
             description="Visible to, and usable by, you alone; start sessions with it as with the app's personas. "
                         f"At most {persona_store.MAX_OWN} at a time (retire one to make room).",
             responses=documented((201, "the character"),
                                  (409, f"too_many_personas: you have {persona_store.MAX_OWN} already")))
def create_persona(body: NewPersona) -> Response[PersonaView]:
    user = current_user(router)
    if persona_store.count_own(user) >= persona_store.MAX_OWN:
        raise TooManyPersonas(f"you have {persona_store.MAX_OWN} characters already: retire one "
                              "(DELETE /v1/personas/{id}) to make another")
    made = persona_store.keep_own(user, None, body.name, body.description, body.system_prompt)
    return Response(201, content_types.APPLICATION_JSON, PersonaView.model_validate(made))


@router.patch("/v1/personas/<persona_id>", operation_id="editPersona", tags=["sessions"],
              summary="edit a character of yours: a new version",
              description="New sessions use the new version; sessions already started keep theirs.",
              responses=documented((200, "the character, at its new version"), _NOT_YOURS))
def edit_persona(persona_id: str, body: PersonaEdit) -> PersonaView:
    user = current_user(router)
    current = persona_store.own(user, persona_id)
    if current is None:
        raise errors.NotFound(f"no character of yours with id {persona_id[:64]!r}")
    kept = persona_store.keep_own(user, persona_id, body.name or current["name"],
                                  current["description"] if body.description is None else body.description,
                                  body.system_prompt or current["system_prompt"] or "")
    if kept is None:  # retired meanwhile
        raise errors.NotFound(f"no character of yours with id {persona_id[:64]!r}")
    return PersonaView.model_validate(kept)


@router.delete("/v1/personas/<persona_id>", operation_id="retirePersona", tags=["sessions"],
               summary="retire a character of yours",
               description="It is listed no more and starts no session; sessions already started with it go on. "
                           "Erasing your account (DELETE /v1/me) deletes it with every version.",
               responses=documented((204, "retired"), _NOT_YOURS))
def retire_persona(persona_id: str):
    if not persona_store.retire_own(current_user(router), persona_id):
        raise errors.NotFound(f"no character of yours with id {persona_id[:64]!r}")
    return Response(204, None, "")


# --- the app's personas, for operators (the token's operator scope; `eros personas` at the command line) -----------
_APP_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class PersonaTaken(errors.ClientError):
    status, code = 409, "persona_taken"


class BadPersonaId(errors.ClientError):
    status, code = 422, "invalid_request"


@router.get("/v1/operator/personas", operation_id="listAppPersonas", tags=["operator"],
            summary="the app's personas, retired ones too, with their prompts",
            responses=documented((200, "the app's personas"), OPERATORS))
def app_personas() -> AppPersonaList:
    return AppPersonaList.model_validate({"personas": persona_store.app_personas(current_operator(router))})


@router.put("/v1/operator/personas/<persona_id>", operation_id="setAppPersona", tags=["operator"],
            summary="make one of the app's personas, or give it a new version",
            description="A changed name, description or prompt is a new version: sessions already started keep "
                        "theirs, new ones get it. The same text again changes nothing. A retired persona stays "
                        "retired.",
            responses=documented((200, "the persona as it is now"), OPERATORS,
                                 (409, "persona_taken: the id is a user's character or another app's persona")))
def set_app_persona(persona_id: str, body: NewPersona) -> AppPersona:
    app = current_operator(router)
    if not _APP_ID.fullmatch(persona_id) or persona_id.startswith("u-"):
        raise BadPersonaId(f"invalid request: path.persona_id: {persona_id[:64]!r} must be 1-64 of a-z 0-9 _ - "
                           "(starting with a letter or digit), not starting with u- (users' characters)",
                           errors=[{"field": "path.persona_id", "problem": "not an app persona id"}])
    persona_store.keep_app(app, persona_id, body.name, body.description, body.system_prompt)
    kept = next((p for p in persona_store.app_personas(app) if p["id"] == persona_id), None)
    if kept is None:
        raise PersonaTaken(f"{persona_id!r} is taken (persona ids are the deployment's): choose another")
    return AppPersona.model_validate(kept)


@router.delete("/v1/operator/personas/<persona_id>", operation_id="retireAppPersona", tags=["operator"],
               summary="retire one of the app's personas",
               description="It is listed no more and starts no session; sessions already started with it go on.",
               responses=documented((204, "retired"), OPERATORS, (404, "no active app persona by that id")))
def retire_app_persona(persona_id: str):
    if not persona_store.retire_app(current_operator(router), persona_id):
        raise errors.NotFound(f"no active app persona {persona_id[:64]!r}")
    return Response(204, None, "")
